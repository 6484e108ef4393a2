"""kafka2postgres and pg2kafka as processes under pgbench, killed at their worst moments,
restarted: the target ends equal to the source row by row, schema included (plain SQL on
both sides).

- keys first (``pgbench -i -I dtpg``) before the slot: the tables come by pg2kafka's
  initial snapshot while TPC-B writes; kafka2postgres exits inside a target transaction
  (failpoint ``kafka2postgres.applied``: rows applied, nothing committed) and pg2kafka is
  killed with SIGKILL during the load; both restart;
- pgbench's default order (tables, data, then keys) with pg2kafka running: each table
  joins when it gains its key and is snapshotted by itself (incremental) while TPC-B
  writes.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from services.pg2kafka import admin
from shared.failpoints import ENV, EXIT_CODE
from tests.e2e.conftest import Proc, pg2kafka_env, pg2kafka_settings, wait_until
from tests.e2e.pgbench import Pgbench, pgbench_binary
from tests.integration.kafka2postgres.conftest import table_rows, table_schema

pytestmark = pytest.mark.e2e

TABLES = {"pgbench_accounts": "aid", "pgbench_branches": "bid", "pgbench_tellers": "tid"}


@pytest.fixture
def target(stack_env: dict[str, str], unique_name: str) -> Any:
    name = f"k2p_{unique_name[-8:]}"
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield name, dsn.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def k2p_env(unique_name: str, topic: str, database: str) -> dict[str, str]:
    return {
        "KAFKA2POSTGRES_CONSUMER__TOPICS": json.dumps([topic]),
        "KAFKA2POSTGRES_CONSUMER__GROUP_ID": f"{unique_name}-k2p",
        "KAFKA2POSTGRES_CONSUMER__DLQ_TOPIC": f"{unique_name}.dlq",
        "KAFKA2POSTGRES_TARGET__POSTGRES__DATABASE": database,
        "KAFKA2POSTGRES_HTTP__PORT": "0",
        "KAFKA2POSTGRES_LOG__FORMAT": "text",
    }


def converged(source: str, target: str, schema: str, procs: list[Proc]) -> None:
    def equal() -> bool:
        died = [p for p in procs if not p.alive() and p.popen.returncode not in (0, -9, EXIT_CODE)]
        assert not died, died[0].tail(60)
        return all(
            table_rows(source, f"{schema}.{t}", k) == table_rows(target, f"{schema}.{t}", k)
            for t, k in TABLES.items()
        )

    wait_until(equal, "the target to equal the source", 300, interval=1)
    for t in TABLES:
        got, got_key = table_schema(target, f"{schema}.{t}")
        want, want_key = table_schema(source, f"{schema}.{t}")
        assert got_key == want_key, t
        # exactly, character(84) included, though only a snapshot described the table:
        # its start marker carries the schema (docs/kafka2postgres.md, "Types")
        assert got == want, t


@pytest.mark.parametrize("order", ["keys_first", "default"])
def test_pgbench_with_a_snapshot_and_kills_ends_equal(
    stack_env: dict[str, str], unique_name: str, target: Any, procs: list[Proc], tmp_path: Path,
    order: str,
) -> None:  # fmt: skip
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    database, target_dsn = target
    dsn = stack_env["WALCAST_PG_DSN"]
    schema = f"pgb_{unique_name[-8:]}"
    topic = f"{unique_name}.cdc"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    pgbench = Pgbench(pgbench_binary(), dsn, schema)
    snapshot = {"mode": "initial", "automatic": True, "chunk_rows": 5000, "workers": 2}
    pg = pg2kafka_settings(env_file, unique_name, topic, 3, snapshot=snapshot)
    pg_env = {
        **pg2kafka_env(unique_name, topic, "primary_key"),
        **{f"PG2KAFKA_SNAPSHOT__{k.upper()}": str(v).lower() for k, v in snapshot.items()},
    }
    try:
        if order == "keys_first":
            pgbench.run("-i", "-I", "dtpg", "-s", "1")  # before the slot: its initial snapshot
        admin.init(pg)
        run = ["--env-file", str(env_file), "run"]
        source = Proc("pg2kafka", run, pg_env, tmp_path / "pg2kafka-0.log")
        procs.append(source)
        if order == "default":
            pgbench.run(
                "-i", "-q", "-s", "1"
            )  # tables, data, then keys: snapshotted as they gain one
        k2p = k2p_env(unique_name, topic, database)
        first = Proc("kafka2postgres", run, {**k2p, ENV: "kafka2postgres.applied=exit@3"},
                     tmp_path / "kafka2postgres-0.log")  # fmt: skip
        procs.append(first)
        load = threading.Thread(target=pgbench.run, args=("-n", "-c", "4", "-j", "2", "-T", "15"))
        load.start()
        wait_until(lambda: not first.alive(), "kafka2postgres to exit inside a transaction", 120)
        assert first.popen.returncode == EXIT_CODE, first.tail(60)
        procs.append(Proc("kafka2postgres", run, k2p, tmp_path / "kafka2postgres-1.log"))
        if order == "keys_first":
            source.kill9()  # mid-load, mid-snapshot perhaps: at-least-once, and versioned
            procs.append(Proc("pg2kafka", run, pg_env, tmp_path / "pg2kafka-1.log"))
        load.join(300)
        assert not load.is_alive()
        converged(dsn, target_dsn, schema, procs)
    finally:
        for p in procs:
            p.stop()
        admin.tear_down(pg)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        client = AdminClient(pg.kafka.client_config())
        existing = client.list_topics(timeout=10).topics
        gone = [t for t in (topic, f"{unique_name}.dlq") if t in existing]
        if gone:
            for fut in client.delete_topics(gone).values():
                fut.result(30)
