"""The chaos suite's short form (the long form, with 20 kills of each service, is
``bench/chaos.py``; its figures are in docs/benchmarks.md): pgbench's tables created
after pg2kafka started, TPC-B with 4 clients (at most 100 transactions/s: the long form
runs them uncapped), and during it a kill -9 of every service,
a Kafka restart, the search engine stopped, a Postgres restart. Afterwards every sink —
both search engines and the Delta mirror — equals Postgres row by row, compared without
walcast's code, and per key the topic's LSNs never go down. Each sink's ``verify`` runs
over and over during it and never reports a difference; once the sinks equal Postgres,
each says so."""

from __future__ import annotations

from bench.chaos import Chaos, Config, print_report


def test_the_pipeline_survives_every_fault_on_a_real_workload(unique_name: str) -> None:
    cfg = Config(
        name=unique_name[:40], rate=100, duration_s=50, kills=1, kafka_restarts=1, engine_stops=1,
        engine_stop_s=12, postgres_restarts=1, converge_timeout_s=300, seed=7, verify=True,
        baseline=False,
    )  # fmt: skip
    chaos = Chaos(cfg)
    try:
        report = chaos.run()
    finally:
        chaos.cleanup()
    print_report(cfg, report)
    kinds = {"kill -9 pg2kafka", "kill -9 kafka2search-opensearch",
             "kill -9 kafka2search-elasticsearch", "kill -9 kafka2spark", "restart kafka",
             "stop opensearch", "restart postgres"}  # fmt: skip
    # every planned fault, during the load (it runs until the plan is done)
    assert sorted(what for _, what in report.fault_log) == sorted(kinds), report.fault_log
    assert all(at < report.load_s for at, _ in report.fault_log), report.fault_log
    assert report.mismatches == {}, report.mismatches
    assert report.lsn_order_violations == 0
    assert report.converge_s is not None
    assert report.events > 0
    # where kafka2spark's time went: read from its batch log, a first batch after each start
    assert report.kafka2spark["batches"] > 0, report.kafka2spark
    assert report.kafka2spark["start_to_first_batch_s"], report.kafka2spark
    # verify (issue 39), run over and over by each sink during the faults and once after:
    # never a difference on the moving source, and each sink's last one says equal
    done = [v for v in report.verifications if "error" not in v]
    assert [v for v in done if not v["ok"]] == [], report.verifications
    assert {v["sink"] for v in done if v["phase"] == "load"}, report.verifications
    after = [v for v in report.verifications if v["phase"] == "after"]
    assert [(v["sink"], v.get("ok")) for v in after] == [
        ("opensearch", True), ("elasticsearch", True), ("delta", True)], after  # fmt: skip
