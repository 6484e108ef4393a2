"""kafka2spark as a real process (``python -m services.kafka2spark run``), fed by pg2kafka
as a process: kill -9 while a micro-batch is being written, restart, and the Delta mirror
(read with deltalake, not Spark) still equals the table; status and /metrics answer."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from services.kafka2spark import admin as spark_admin
from services.kafka2spark.settings import Kafka2SparkSettings
from services.pg2kafka import admin
from shared.settings import load_settings
from tests.e2e.conftest import Proc, pg2kafka_env, pg2kafka_settings, wait_until, write_rows
from tests.ports import free_port


@pytest.fixture
def flow(stack_env: dict[str, str], unique_name: str, tmp_path: Path) -> Any:
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    topic = f"{unique_name}.cdc"
    root = tmp_path / "delta"
    port = free_port()
    table = f"{unique_name}_rows"
    # the table alone: the mirror's lag reaches 0 whatever other tests write beside it
    only = {"include": [f"public.{table}"]}
    pg_env = {**pg2kafka_env(unique_name, topic, "primary_key"),
              "PG2KAFKA_FILTERS__INCLUDE": json.dumps(only["include"])}  # fmt: skip
    spark_env = {
        "KAFKA2SPARK_SOURCE__TOPICS": json.dumps([topic]),
        "KAFKA2SPARK_SOURCE__GROUP_ID": f"{unique_name}-group",
        "KAFKA2SPARK_SOURCE__MAX_OFFSETS_PER_TRIGGER": "4000",
        "KAFKA2SPARK_DELTA__ROOT": str(root),
        "KAFKA2SPARK_TRIGGER__INTERVAL_S": "1",
        "KAFKA2SPARK_HTTP__PORT": str(port),
        "KAFKA2SPARK_LOG__FORMAT": "text",
    }
    pg = pg2kafka_settings(env_file, unique_name, topic, 3, filters=only)
    spark = load_settings(
        Kafka2SparkSettings, env_file=env_file,
        source={"topics": [topic], "group_id": f"{unique_name}-group"}, delta={"root": str(root)},
    )  # fmt: skip
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, pad text)")
    admin.init(pg)
    yield {
        "env_file": env_file, "pg_env": pg_env, "spark_env": spark_env, "dsn": dsn,
        "table": table, "spark": spark, "port": port, "root": root,
    }  # fmt: skip
    admin.tear_down(pg)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {table}")
    client = AdminClient(pg.kafka.client_config())
    if topic in client.list_topics(timeout=10).topics:
        client.delete_topics([topic])[topic].result(30)


def start(flow: Any, procs: list[Proc], tmp_path: Path, service: str) -> Proc:
    env = flow["pg_env"] if service == "pg2kafka" else flow["spark_env"]
    p = Proc(service, ["--env-file", str(flow["env_file"]), "run"], env,
             tmp_path / f"{service}-{len(procs)}.log")  # fmt: skip
    procs.append(p)
    return p


def pg_rows(flow: Any) -> dict[int, tuple[int, str]]:
    with psycopg.connect(flow["dsn"], autocommit=True) as c:
        return {r[0]: (r[1], r[2]) for r in c.execute(f"SELECT id, v, pad FROM {flow['table']}")}


def delta_rows(flow: Any) -> dict[int, tuple[int, str]]:
    path = flow["root"] / f"public.{flow['table']}"
    if not (path / "_delta_log").is_dir():
        return {}
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {r["id"]: (r["v"], r["pad"]) for r in rows}


def batch_in_flight(checkpoint: Path) -> bool:
    """Spark writes offsets/<n> when batch n starts and commits/<n> when it is done."""
    started = {p.name for p in (checkpoint / "offsets").glob("[0-9]*")}
    done = {p.name for p in (checkpoint / "commits").glob("[0-9]*")}
    return bool(started - done) and bool(done)


def test_kill_9_mid_batch_then_restart(flow: Any, procs: list[Proc], tmp_path: Path) -> None:
    start(flow, procs, tmp_path, "pg2kafka")
    write_rows(flow["dsn"], flow["table"], 1, 8000, updates=1)
    job = start(flow, procs, tmp_path, "kafka2spark")
    checkpoint = flow["spark"].delta.checkpoint_path()
    wait_until(
        lambda: (checkpoint / "commits").is_dir() and batch_in_flight(checkpoint),
        "a batch in flight after a first one committed",
        240,
        interval=0.05,
    )
    job.kill9()
    write_rows(flow["dsn"], flow["table"], 8001, 3000)
    with psycopg.connect(flow["dsn"], autocommit=True) as c:
        c.execute(f"DELETE FROM {flow['table']} WHERE id % 7 = 0")
        c.execute(f"UPDATE {flow['table']} SET v = v + 10 WHERE id % 5 = 0")
    start(flow, procs, tmp_path, "kafka2spark")
    want = pg_rows(flow)

    def caught_up() -> bool:
        dead = [p for p in procs if not p.alive() and p.popen.returncode not in (0, -9)]
        assert not dead, dead[0].tail()
        return spark_admin.status(flow["spark"])["total_lag"] == 0 and delta_rows(flow) == want

    wait_until(caught_up, "the mirror to equal the table", 300, interval=2)
    info = spark_admin.status(flow["spark"])
    assert info["last_batch"] is not None
    assert any(
        t["table"] == f"public.{flow['table']}" and t["rows"] == len(want) for t in info["tables"]
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{flow['port']}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert "walcast_kafka2spark_batches_total" in metrics
    assert "walcast_kafka2spark_rows_merged_total" in metrics
    with urllib.request.urlopen(f"http://127.0.0.1:{flow['port']}/ready", timeout=10) as r:
        assert r.status == 200


def stopped_at_first_batch(
    flow: Any, procs: list[Proc], tmp_path: Path, max_offsets: int
) -> tuple[Proc, str]:
    """kafka2spark started with a SIGTERM the moment micro-batch 0 begins (a failpoint, not
    timing), ``max_offsets`` records a batch, 3,000 inserts and 3,000 updates waiting; its
    process once stopped, and its log."""
    start(flow, procs, tmp_path, "pg2kafka")
    write_rows(flow["dsn"], flow["table"], 1, 3000, updates=1)
    wait_until(
        lambda: spark_admin.status(flow["spark"])["total_lag"] >= 6000,
        "pg2kafka to send the 6,000 changes",
        300,
        interval=1,
    )
    env = {
        **flow["spark_env"],
        "KAFKA2SPARK_SOURCE__MAX_OFFSETS_PER_TRIGGER": str(max_offsets),
        "KAFKA2SPARK_TRIGGER__STOP_GRACE_S": "600",  # a slow machine still finishes it
        "WALCAST_FAILPOINTS": "kafka2spark.batch_started=term",
    }
    job = Proc("kafka2spark", ["--env-file", str(flow["env_file"]), "run"], env,
               tmp_path / "kafka2spark-term.log")  # fmt: skip
    procs.append(job)
    wait_until(lambda: not job.alive(), "kafka2spark to stop at its first batch's SIGTERM", 600)
    log = job.log.read_text(errors="replace")
    assert job.popen.returncode == 0, job.tail(60)
    assert "failpoint kafka2spark.batch_started" in log, job.tail(60)
    assert "finishing micro-batch 0 before stopping" in log, job.tail(60)
    assert "did not finish within" not in log, job.tail(60)
    assert (flow["spark"].delta.checkpoint_path() / "commits" / "0").exists(), job.tail(60)
    return job, log


def test_a_stop_mid_batch_lets_the_batch_finish_first(
    flow: Any, procs: list[Proc], tmp_path: Path
) -> None:
    """Everything in one micro-batch: SIGTERM as it begins, and it is written and
    committed to the checkpoint before the query stops — no Delta commit cut, no error
    spew — the process exits 0, and the mirror equals the table without a restart."""
    _, log = stopped_at_first_batch(flow, procs, tmp_path, max_offsets=100_000)
    assert "StackOverflowError" not in log
    assert "Traceback" not in log
    assert delta_rows(flow) == pg_rows(flow)


def test_a_stop_mid_batch_waits_for_that_batch_only(
    flow: Any, procs: list[Proc], tmp_path: Path
) -> None:
    """A backlog behind the batch in hand (batches of 1,000 of 6,000): batch 0 is
    committed, the backlog is not waited for (no batch 1 committed), and a restart goes
    on from batch 1 to the table's state."""
    stopped_at_first_batch(flow, procs, tmp_path, max_offsets=1000)
    checkpoint = flow["spark"].delta.checkpoint_path()
    assert not (checkpoint / "commits" / "1").exists(), "the stop waited for the backlog"
    assert 0 < len(delta_rows(flow)) < 3000, "batch 0 holds a part of the rows"

    again = start(flow, procs, tmp_path, "kafka2spark")
    want = pg_rows(flow)

    def caught_up() -> bool:
        assert again.alive(), again.tail(60)
        return spark_admin.status(flow["spark"])["total_lag"] == 0 and delta_rows(flow) == want

    wait_until(caught_up, "the mirror to equal the table after the restart", 300, interval=2)
    restarted = again.log.read_text(errors="replace")
    assert "batch 1:" in restarted, again.tail(60)  # went on from the next batch
    assert "batch 0:" not in restarted, again.tail(60)  # batch 0 was not run again
