"""walcast's sinks fed by the real Debezium PostgreSQL connector (the local stack's optional
``debezium`` component), without pg2kafka: pgbench's tables snapshotted by the connector
(``op r``), TPC-B runs, a reload (``TRUNCATE`` + ``COPY``: the connector set to write
truncates) and more TPC-B, while kafka2search (``input_format: debezium``) and
kafka2spark (``input_format: auto``) run as processes on the connector's topics. The
index and the Delta mirror must equal the tables, read without walcast's code (plain
SQL, plain HTTP, the ``deltalake`` reader)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from tests import debezium
from tests.e2e.conftest import Proc
from tests.e2e.pgbench import (
    TABLES,
    Pgbench,
    converge,
    delta_rows,
    http,
    index_rows,
    pgbench_binary,
)


@pytest.fixture
def flow(stack_env: dict[str, str], unique_name: str, tmp_path: Path) -> Any:
    url = debezium.ensure_running()
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    schema = unique_name
    name = unique_name.replace("_", "-")
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    pgbench = Pgbench(pgbench_binary(), dsn, schema)
    pgbench.run("-i", "-I", "dtpg", "-s", "1")  # rows before the connector: its snapshot
    search_url = stack_env["WALCAST_OPENSEARCH_URL"]
    prefix = f"{unique_name}_d"
    config = {
        "table.include.list": ",".join(f"{schema}.{t}" for t in TABLES),
        "snapshot.mode": "initial",
        "skipped.operations": "none",  # truncates too (the connector skips them by default)
    }
    try:
        with debezium.connector(url, stack_env, prefix, **config):
            topics = [f"{prefix}.{schema}.{t}" for t in TABLES]
            admin = AdminClient({"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]})
            debezium.wait_for(
                lambda: set(topics) <= set(admin.list_topics(timeout=10).topics),
                "the connector's snapshot topics",
            )
            yield {
                "env_file": env_file, "dsn": dsn, "schema": schema, "pgbench": pgbench,
                "root": tmp_path / "delta", "search_url": search_url,
                "alias": f"{name}-{{table}}",
                "kafka2search": {
                    "KAFKA2SEARCH_CONSUMER__TOPICS": json.dumps(topics),
                    "KAFKA2SEARCH_CONSUMER__INPUT_FORMAT": "debezium",
                    "KAFKA2SEARCH_CONSUMER__GROUP_ID": f"{name}-search",
                    "KAFKA2SEARCH_CONSUMER__DLQ_TOPIC": f"{name}.dlq",
                    "KAFKA2SEARCH_ENGINE__KIND": "opensearch",
                    "KAFKA2SEARCH_ENGINE__URLS": json.dumps([search_url]),
                    "KAFKA2SEARCH_INDEX__NAME_TEMPLATE": f"{name}-{{table}}",
                    "KAFKA2SEARCH_HTTP__PORT": "0",
                    "KAFKA2SEARCH_LOG__FORMAT": "text",
                },
                "kafka2spark": {
                    "KAFKA2SPARK_SOURCE__TOPICS": json.dumps(topics),
                    "KAFKA2SPARK_SOURCE__INPUT_FORMAT": "auto",
                    "KAFKA2SPARK_SOURCE__GROUP_ID": f"{name}-spark",
                    "KAFKA2SPARK_DELTA__ROOT": str(tmp_path / "delta"),
                    "KAFKA2SPARK_TRIGGER__INTERVAL_S": "2",
                    "KAFKA2SPARK_HTTP__PORT": "0",
                    "KAFKA2SPARK_LOG__FORMAT": "text",
                },
            }  # fmt: skip
    finally:
        for table in TABLES:
            alias = f"{name}-{table}"
            for index in json.loads(http(search_url, f"/_alias/{alias}", missing="{}")):
                http(search_url, f"/{index}", method="DELETE")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"DROP SCHEMA {schema} CASCADE")
        admin = AdminClient({"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]})
        if f"{name}.dlq" in admin.list_topics(timeout=10).topics:
            for fut in admin.delete_topics([f"{name}.dlq"]).values():
                fut.result(30)


def test_sinks_fed_by_the_real_connector_equal_the_tables(
    flow: Any, procs: list[Proc], tmp_path: Path
) -> None:
    for service in ("kafka2search", "kafka2spark"):
        args = ["--env-file", str(flow["env_file"]), "run"]
        procs.append(Proc(service, args, flow[service], tmp_path / f"{service}.log"))
    pgbench = flow["pgbench"]
    pgbench.run("-n", "-c", "4", "-j", "2", "-t", "200")  # TPC-B on the snapshotted rows
    pgbench.run("-i", "-I", "g", "-s", "1")  # TRUNCATE + COPY, one transaction
    pgbench.run("-n", "-c", "4", "-j", "2", "-t", "200")
    converge(flow, procs, "the search index", index_rows)
    converge(flow, procs, "the Delta mirror", delta_rows)
    search_log = (tmp_path / "kafka2search.log").read_text(errors="replace")
    assert "truncated" in search_log  # the connector's truncates were applied, by version
    assert "dead letter from" not in search_log, (
        f"kafka2search dead-lettered:\n{search_log[-3000:]}"
    )
    quarantine = flow["root"] / "_quarantine"
    assert not quarantine.exists(), (
        "kafka2spark quarantined records: "
        + "".join(
            line
            for line in (tmp_path / "kafka2spark.log").open(errors="replace")
            if "quarantined " in line
        )[-3000:]
    )
