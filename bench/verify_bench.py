"""The cost of ``verify`` (issue 39): `pgbench -i -s N` streamed into OpenSearch and Delta
by the real services, then, on the caught-up pipeline, each of these as its own process,
timed with its peak memory:

- ``COPY pgbench_accounts TO STDOUT`` (a client reading every row's text);
- one full read of the sink: a scroll of the index (every document), a Delta scan (every
  column, deltalake);
- ``kafka2search verify`` and ``kafka2spark verify`` of ``pgbench_accounts``;
- ``kafka2search verify --values`` (every document's stamp checked: a full read of the
  index by design, shown beside the scroll; no target).

The target (issue 39): a full verify costs no more than those two reads together —
ratio = (COPY + the sink's full read) / verify >= 1.0 — and a verify that finds nothing
different reads no row out of the engine (``ranges_looked_into`` = 0). Ratios are of
times measured in the same run.

    python bench/verify_bench.py --scale 100     # the long form: 10M accounts
    python bench/verify_bench.py --scale 2       # a quick run
    python bench/verify_bench.py --scale 100 --keep   # keep what was loaded, then measure
    python bench/verify_bench.py --reuse vb_1234 --work /tmp/walcast-chaos-...  # again

The measurements start once both sinks' consumer groups have no lag (every record
applied: the table's rows and a snapshot's read rows of them), so that no step waits for
a sink still catching up.

Needs the local stack (``deploy/local/walcast up``); uses its own schema, slot, topic,
indices and Delta directory, removed afterwards. Prints a table, writes
``bench/results/verify.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.chaos import Chaos, Config, Service, stack_env  # noqa: E402

TABLE = "pgbench_accounts"


def measure(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of one command run as its own process."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, cwd=REPO)
    out = proc.stdout.read().decode() if proc.stdout is not None else ""
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):  # verify exits 1 on a difference: reported, not fatal
        raise RuntimeError(f"{' '.join(cmd[:4])}: exit {proc.returncode}")
    return wall, usage.ru_maxrss / 1024, out


# -- the baselines, each run as `verify_bench.py _<name> ...` in its own process ------------


def _copy(dsn: str, schema: str) -> None:
    import psycopg

    n = 0
    with (
        psycopg.connect(dsn) as conn,
        conn.cursor().copy(f'COPY "{schema}".{TABLE} TO STDOUT') as cp,
    ):
        for block in cp:
            n += len(block)
    print(json.dumps({"bytes": n}))


def _post(url: str, body: Any) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")  # noqa: S310
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=300) as resp:  # noqa: S310
        return json.loads(resp.read())


def _scroll(url: str, alias: str) -> None:
    """Every document of the index, as a reader would fetch them (``_source`` included)."""
    docs = 0
    page = _post(f"{url}/{alias}/_search?scroll=2m", {"size": 5000, "sort": ["_doc"]})
    while page["hits"]["hits"]:
        docs += len(page["hits"]["hits"])
        page = _post(f"{url}/_search/scroll", {"scroll": "2m", "scroll_id": page["_scroll_id"]})
    print(json.dumps({"documents": docs}))


def _delta(path: str) -> None:
    from deltalake import DeltaTable

    # Every column of every row, batch by batch (one table of 10M rows at once aborted
    # deltalake's reader here: "terminate called without an active exception").
    rows = sum(b.num_rows for b in DeltaTable(path).to_pyarrow_dataset().to_batches())
    print(json.dumps({"rows": rows}))


# -- the run ---------------------------------------------------------------------------------


def run(
    scale: int, keep: bool, reuse: str | None = None, work: Path | None = None
) -> dict[str, Any]:
    """``reuse``: the name of a run kept before (``--keep``), in ``work``: its services are
    started again on what it loaded, and only the measurements run."""
    cfg = Config(name=reuse or f"vb_{os.getpid()}", scale=scale, kills=0)
    if work is not None:
        cfg.work = work
    c = Chaos(cfg)
    envs = c.envs()
    if scale >= 20:
        # the default 1 GB driver heap ran out in a MERGE reading a file of a 10M-row mirror
        # (docs/benchmarks.md, tenth session); docs/kafka2spark.md says to raise it so
        envs["kafka2spark"]["KAFKA2SPARK_SPARK__CONF"] = json.dumps({"spark.driver.memory": "8g"})
    wanted = ("pg2kafka", "kafka2search-opensearch", "kafka2spark")
    try:
        if reuse:
            for svc in wanted:
                c.services[svc] = Service(svc, svc.split("-")[0], envs[svc], cfg)
                c.services[svc].start()
            return _measure(c, cfg, envs, time.monotonic(), scale)
        c.sql(f"CREATE SCHEMA {c.schema}")
        init = subprocess.run(
            [sys.executable, "-m", "services.pg2kafka", "--env-file",
             str(Path(c.env["WALCAST_STACK_DIR"]) / "walcast.env"), "init"],
            env={**os.environ, **envs["pg2kafka"]}, cwd=REPO, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        if init.returncode != 0:
            raise RuntimeError(f"pg2kafka init: {init.stderr[-2000:]}")
        for svc in wanted:
            module = svc.split("-")[0]
            c.services[svc] = Service(svc, module, envs[svc], cfg)
            c.services[svc].start()
        time.sleep(3)
        t0 = time.monotonic()
        c.bench("-i", "-I", "dtpg", "-s", str(scale))  # tables made after pg2kafka started
        return _measure(c, cfg, envs, t0, scale)
    finally:
        for s in c.services.values():
            s.stop()
        if not keep:
            c.cleanup()


def _measure(
    c: Chaos, cfg: Config, envs: dict[str, dict[str, str]], t0: float, scale: int
) -> dict[str, Any]:
    """Once the sinks caught up: the baselines and both verifications, each timed."""
    rows = int(c.sql(f"SELECT count(*) FROM {c.schema}.{TABLE}")[0][0])
    alias = f"{cfg.name.replace('_', '-')}-opensearch-{TABLE}"
    delta = c.delta / f"{c.schema}.{TABLE}"
    print(f"[verify-bench] {rows} accounts; waiting for the sinks", flush=True)
    _wait_caught_up(c, alias, delta, rows)
    load_s = time.monotonic() - t0
    print(f"[verify-bench] caught up after {load_s:.0f} s; measuring", flush=True)
    py = sys.executable
    me = str(Path(__file__).resolve())
    results: dict[str, Any] = {"scale": scale, "rows": rows, "load_s": round(load_s, 1)}
    for name, cmd in (
        ("copy", [py, me, "_copy", c.dsn, c.schema]),
        ("scroll", [py, me, "_scroll", c.url("opensearch"), alias]),
        ("delta_scan", [py, me, "_delta", str(delta)]),
    ):
        wall, rss, _out = measure(cmd, {})
        results[name] = {
            "s": round(wall, 2),
            "rss_mb": round(rss),
            "rows_per_s": round(rows / wall),
        }
    verify_env = {
        "VERIFY__POSTGRES__HOST": c.env["PG2KAFKA_POSTGRES__HOST"],
        "VERIFY__POSTGRES__PORT": c.env["PG2KAFKA_POSTGRES__PORT"],
        "VERIFY__POSTGRES__DATABASE": c.env["PG2KAFKA_POSTGRES__DATABASE"],
        "VERIFY__POSTGRES__USER": c.env["PG2KAFKA_POSTGRES__USER"],
        "VERIFY__POSTGRES__PASSWORD": c.env["PG2KAFKA_POSTGRES__PASSWORD"],
        "VERIFY__SLOT": cfg.name,
    }
    env_file = str(Path(c.env["WALCAST_STACK_DIR"]) / "walcast.env")
    for name, svc, prefix, extra in (
        ("verify_opensearch", "kafka2search-opensearch", "KAFKA2SEARCH_", []),
        # every document's stamp checked too: a full read of the index, by design
        ("verify_opensearch_values", "kafka2search-opensearch", "KAFKA2SEARCH_", ["--values"]),
        ("verify_delta", "kafka2spark", "KAFKA2SPARK_", []),
    ):
        module = svc.split("-")[0]
        env = {**envs[svc], **{prefix + k: v for k, v in verify_env.items()}}
        cmd = [py, "-m", f"services.{module}", "--env-file", env_file, "verify",
               "--table", f"{c.schema}.{TABLE}", "--json", *extra]  # fmt: skip
        wall, rss, out = measure(cmd, env)
        (report,) = json.loads(out)["tables"]
        results[name] = {"s": round(wall, 2), "rss_mb": round(rss),
                         "rows_per_s": round(rows / wall), "report": report}  # fmt: skip
    results["ratio_opensearch"] = round(
        (results["copy"]["s"] + results["scroll"]["s"]) / results["verify_opensearch"]["s"], 3
    )
    results["ratio_opensearch_values"] = round(
        (results["copy"]["s"] + results["scroll"]["s"]) / results["verify_opensearch_values"]["s"],
        3,
    )
    results["ratio_delta"] = round(
        (results["copy"]["s"] + results["delta_scan"]["s"]) / results["verify_delta"]["s"], 3
    )
    return results


def _wait_caught_up(c: Chaos, alias: str, delta: Path, rows: int, timeout_s: float = 3600) -> None:
    from deltalake import DeltaTable

    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    while True:
        c.http(c.url("opensearch"), f"/{alias}/_refresh", method="POST")
        count = (c.http(c.url("opensearch"), f"/{alias}/_count") or {}).get("count", 0)
        mirrored = 0
        if any((delta / "_delta_log").glob("*.json")):
            mirrored = DeltaTable(str(delta)).to_pyarrow_table(columns=["aid"]).num_rows
        lag = _lag(c, cfg_groups(c))
        if count == rows and mirrored == rows and not lag:
            return
        dead = [s.name for s in c.services.values() if s.died()]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(
                f"sinks not caught up: index {count}, mirror {mirrored} of {rows}, records"
                f" not yet applied {lag}; exited: {dead}"
            )
        if time.monotonic() >= shown + 60:
            shown = time.monotonic()
            print(f"[verify-bench] index {count}, mirror {mirrored}; behind: {lag}", flush=True)
        time.sleep(5)


def cfg_groups(c: Chaos) -> list[str]:
    """The consumer groups of the two sinks measured."""
    name = c.cfg.name.replace("_", "-")
    return [f"{name}-opensearch", f"{name}-spark"]


def _lag(c: Chaos, groups: list[str]) -> dict[str, int]:
    """Records not yet applied, per group with any (committed offsets behind the ends)."""
    from confluent_kafka import Consumer, TopicPartition

    out: dict[str, int] = {}
    boot = c.env["PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS"]
    for group in groups:
        consumer = Consumer({"bootstrap.servers": boot, "group.id": group,
                             "enable.auto.commit": False})  # fmt: skip
        try:
            meta = consumer.list_topics(c.topic, timeout=10).topics[c.topic]
            parts = [TopicPartition(c.topic, p) for p in meta.partitions]
            behind = 0
            for tp in consumer.committed(parts, timeout=10):
                _low, high = consumer.get_watermark_offsets(tp, timeout=10)
                behind += high - max(tp.offset, 0)
            if behind:
                out[group] = behind
        finally:
            consumer.close()
    return out


def print_table(r: dict[str, Any]) -> None:
    print(
        f"\nverify_bench: pgbench scale {r['scale']} ({r['rows']} accounts),"
        f" streamed in {r['load_s']} s"
    )
    print(f"| {'step':<26} | {'s':>8} | {'rows/s':>10} | {'peak RSS MB':>11} |")
    print(f"| {'-' * 26} | {'-' * 8} | {'-' * 10} | {'-' * 11} |")
    steps = ("copy", "scroll", "delta_scan", "verify_opensearch", "verify_opensearch_values",
             "verify_delta")  # fmt: skip
    for k in steps:
        v = r[k]
        print(f"| {k:<26} | {v['s']:>8} | {v['rows_per_s']:>10} | {v['rss_mb']:>11} |")
    for k in ("verify_opensearch", "verify_opensearch_values", "verify_delta"):
        rep = r[k]["report"]
        print(f"{k}: ok={rep['ok']} ranges={rep['ranges']} looked_into={rep['ranges_looked_into']}")
    print(f"ratio (COPY + scroll) / verify, OpenSearch: {r['ratio_opensearch']}  (target >= 1.0)")
    print(f"ratio (COPY + Delta scan) / verify, Delta:  {r['ratio_delta']}  (target >= 1.0)")
    print(f"ratio (COPY + scroll) / verify --values, OpenSearch: {r['ratio_opensearch_values']}"
          "  (no target: it reads every document)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("_"):
        step, rest = argv[0], argv[1:]
        if step == "_copy":
            _copy(*rest)
        elif step == "_scroll":
            _scroll(*rest)
        else:
            _delta(*rest)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=int, default=100)
    p.add_argument("--keep", action="store_true", help="keep the schema, indices and Delta")
    p.add_argument("--reuse", help="measure again on a kept run (its name, vb_<pid>)")
    p.add_argument("--work", type=Path, help="the kept run's work directory (with --reuse)")
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "verify.json")
    args = p.parse_args(argv)
    stack_env()  # fails early without the local stack
    if args.reuse and args.work is None:
        p.error("--reuse needs --work, the kept run's directory")
    results = run(args.scale, args.keep or bool(args.reuse), args.reuse, args.work)
    print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    return (
        0
        if results["verify_opensearch"]["report"]["ok"] and results["verify_delta"]["report"]["ok"]
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
