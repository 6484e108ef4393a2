"""kafka2spark against a Spark standalone cluster (a master and a worker started from the
pyspark distribution, on 127.0.0.1): the same job, ``spark.master: spark://…``, mirrors
a table exactly — executors in their own JVM, jars shipped by the driver."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyspark
import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from services.pg2kafka import admin
from tests.e2e.conftest import Proc, pg2kafka_env, pg2kafka_settings, wait_until
from tests.ports import free_port

SPARK_HOME = Path(pyspark.__file__).parent


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker (1 core, 1 GB); yields the master URL."""
    port = free_port()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("master", "worker")}
    master = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(port), "--webui-port", str(free_port())],
        env=env, stdout=logs["master"], stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen(
        [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
         "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
         "--work-dir", str(tmp_path / "work")],
        env=env, stdout=logs["worker"], stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(
            lambda: "Registering worker" in (tmp_path / "master.log").read_text(errors="replace"),
            "the worker to register with the master",
            120,
        )
        yield url
    finally:
        for p in (worker, master):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs.values():
            f.close()


def test_the_job_runs_on_a_standalone_cluster(
    cluster: str, stack_env: dict[str, str], unique_name: str, tmp_path: Path
) -> None:
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    topic = f"{unique_name}.cdc"
    pg = pg2kafka_settings(env_file, unique_name, topic, 2)
    table = f"{unique_name}_rows"
    dsn = stack_env["WALCAST_PG_DSN"]
    procs: list[Proc] = []
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, note text)")
    admin.init(pg)
    try:
        pg_env = pg2kafka_env(unique_name, topic)
        procs.append(Proc("pg2kafka", ["--env-file", str(env_file), "run"], pg_env,
                          tmp_path / "pg2kafka.log"))  # fmt: skip
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"INSERT INTO {table} SELECT g, g, 'n' || g FROM generate_series(1, 500) g")
            c.execute(f"UPDATE {table} SET v = v * 2 WHERE id % 3 = 0")
            c.execute(f"DELETE FROM {table} WHERE id % 11 = 0")
            lsn = c.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()

        def confirmed() -> bool:
            with psycopg.connect(dsn, autocommit=True) as c:
                row = c.execute(
                    "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
                    " WHERE slot_name = %s",
                    [unique_name],
                ).fetchone()
            # (a slot just made has no confirmed position yet: NULL)
            return (
                row is not None
                and row[0] is not None
                and lsn is not None
                and int(row[0]) >= int(lsn[0])
            )

        wait_until(confirmed, "pg2kafka to deliver the workload", 120)
        root = tmp_path / "delta"
        spark_env = {
            "SPARK_LOCAL_IP": "127.0.0.1",
            "KAFKA2SPARK_SPARK__MASTER": cluster,
            "KAFKA2SPARK_SPARK__CONF": json.dumps(
                {
                    "spark.driver.host": "127.0.0.1",
                    "spark.driver.bindAddress": "127.0.0.1",
                    "spark.executor.memory": "512m",
                    "spark.cores.max": "1",
                }
            ),
            "KAFKA2SPARK_SOURCE__TOPICS": json.dumps([topic]),
            "KAFKA2SPARK_SOURCE__GROUP_ID": f"{unique_name}-group",
            "KAFKA2SPARK_DELTA__ROOT": str(root),
            "KAFKA2SPARK_TRIGGER__MODE": "available_now",
            "KAFKA2SPARK_HTTP__PORT": "0",
            "KAFKA2SPARK_LOG__FORMAT": "text",
        }
        job = Proc("kafka2spark", ["--env-file", str(env_file), "run"], spark_env,
                   tmp_path / "kafka2spark.log")  # fmt: skip
        procs.append(job)
        wait_until(lambda: not job.alive(), "the available-now run to finish", 600, interval=1)
        assert job.popen.returncode == 0, job.tail(60)
        log = (tmp_path / "kafka2spark.log").read_text(errors="replace")
        assert "batch 0:" in log
        assert "[Stage " not in log, "Spark's console progress bars in the service's log"
        with psycopg.connect(dsn, autocommit=True) as c:
            want = {r[0]: (r[1], r[2]) for r in c.execute(f"SELECT id, v, note FROM {table}")}
        rows = DeltaTable(str(root / f"public.{table}")).to_pyarrow_table().to_pylist()
        got: dict[int, Any] = {r["id"]: (r["v"], r["note"]) for r in rows}
        assert got == want
        # The executor ran in the worker, not in the driver's JVM.
        assert any((tmp_path / "work").glob("app-*/*/stderr"))
    finally:
        for p in procs:
            p.stop()
        admin.tear_down(pg)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"DROP TABLE IF EXISTS {table}")
        client = AdminClient(pg.kafka.client_config())
        if topic in client.list_topics(timeout=10).topics:
            client.delete_topics([topic])[topic].result(30)
