"""A real workload through the whole pipeline under primary-key partitioning: pgbench's
data load (``TRUNCATE`` then ``COPY`` in one transaction) repeated, with TPC-B runs in
between, while pg2kafka, kafka2search and kafka2spark run as processes.

Seen before the fix: the truncate went to one partition while the rows spread over
three, so kafka2search indexed rows from the other partitions first and then deleted
them (``truncated ...pgbench_accounts: 82 documents removed``). The sinks are compared
with Postgres independently of walcast's code: plain SQL, plain HTTP, the ``deltalake``
reader."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from services.pg2kafka import admin
from tests.e2e.conftest import Proc, pg2kafka_env, pg2kafka_settings

TABLES = {"pgbench_branches": "bid", "pgbench_tellers": "tid", "pgbench_accounts": "aid"}


def pgbench_binary() -> str:
    found = shutil.which("pgbench") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None
    )
    if found is None:
        pytest.fail("pgbench not found: the local stack installs it with PostgreSQL")
    return found


@pytest.fixture
def flow(stack_env: dict[str, str], unique_name: str, tmp_path: Path) -> Any:
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    schema = unique_name
    topic = f"{unique_name}.cdc"
    name = unique_name.replace("_", "-")
    root = tmp_path / "delta"
    dsn = stack_env["WALCAST_PG_DSN"]
    filters = {
        "PG2KAFKA_FILTERS__INCLUDE": json.dumps([f"{schema}.*"]),
        # no key: nothing to index or merge by (snapshots on a new key are issue 17)
        "PG2KAFKA_FILTERS__EXCLUDE": json.dumps([f"{schema}.pgbench_history"]),
    }
    pg = pg2kafka_settings(env_file, unique_name, topic, 3)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
    pgbench = Pgbench(pgbench_binary(), dsn, schema)
    pgbench.run("-i", "-I", "dtp", "-s", "1")  # tables with their keys, no rows yet
    admin.init(pg)
    search_url = stack_env["WALCAST_OPENSEARCH_URL"]
    yield {
        "env_file": env_file, "dsn": dsn, "schema": schema, "root": root, "pgbench": pgbench,
        "search_url": search_url, "alias": f"{name}-{{table}}",
        "pg2kafka": {**pg2kafka_env(unique_name, topic, "primary_key"), **filters},
        "kafka2search": {
            "KAFKA2SEARCH_CONSUMER__TOPICS": json.dumps([topic]),
            "KAFKA2SEARCH_CONSUMER__GROUP_ID": f"{name}-search",
            "KAFKA2SEARCH_CONSUMER__DLQ_TOPIC": f"{name}.dlq",
            "KAFKA2SEARCH_ENGINE__KIND": "opensearch",
            "KAFKA2SEARCH_ENGINE__URLS": json.dumps([search_url]),
            "KAFKA2SEARCH_INDEX__NAME_TEMPLATE": f"{name}-{{table}}",
            "KAFKA2SEARCH_HTTP__PORT": "0",
            "KAFKA2SEARCH_LOG__FORMAT": "text",
        },
        "kafka2spark": {
            "KAFKA2SPARK_SOURCE__TOPICS": json.dumps([topic]),
            "KAFKA2SPARK_SOURCE__GROUP_ID": f"{name}-spark",
            "KAFKA2SPARK_DELTA__ROOT": str(root),
            "KAFKA2SPARK_TRIGGER__INTERVAL_S": "2",
            "KAFKA2SPARK_HTTP__PORT": "0",
            "KAFKA2SPARK_LOG__FORMAT": "text",
        },
    }  # fmt: skip
    admin.tear_down(pg)
    for table in TABLES:
        alias = f"{name}-{table}"
        for index in json.loads(http(search_url, f"/_alias/{alias}", missing="{}")):
            http(search_url, f"/{index}", method="DELETE")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP SCHEMA {schema} CASCADE")
    client = AdminClient(pg.kafka.client_config())
    present = client.list_topics(timeout=10).topics
    gone = [t for t in (topic, f"{name}.dlq") if t in present]
    for fut in client.delete_topics(gone).values():
        fut.result(30)


class Pgbench:
    def __init__(self, binary: str, dsn: str, schema: str) -> None:
        self.binary, self.dsn, self.schema = binary, dsn, schema

    def run(self, *args: str) -> str:
        env = {**os.environ, "PGOPTIONS": f"-c search_path={self.schema}"}
        done = subprocess.run(
            [self.binary, *args, self.dsn], env=env, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"pgbench {' '.join(args)}: {done.stderr[-2000:]}"
        return done.stdout


def http(base: str, path: str, body: Any = None, method: str = "GET", missing: str = "") -> str:
    """A plain HTTP request to the search engine (no walcast code); ``missing`` is the
    answer to a 404."""
    data = json.dumps(body).encode() if body is not None else None
    assert base.startswith("http")
    req = urllib.request.Request(base + path, data=data, method=method if data is None else "POST")  # noqa: S310
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and missing:
            return missing
        raise


def pg_rows(flow: Any, table: str) -> dict[str, dict[str, Any]]:
    key = TABLES[table]
    with psycopg.connect(flow["dsn"], autocommit=True) as c:
        cur = c.execute(f"SELECT {key}, to_jsonb(x) FROM {flow['schema']}.{table} x")
        return {str(r[0]): r[1] for r in cur}


def index_rows(flow: Any, table: str) -> dict[str, dict[str, Any]]:
    base, alias = flow["search_url"], flow["alias"].format(table=table)
    if http(base, f"/_alias/{alias}", missing="{}") == "{}":
        return {}
    http(base, f"/{alias}/_refresh", method="POST")
    out: dict[str, dict[str, Any]] = {}
    page = json.loads(http(base, f"/{alias}/_search?scroll=1m", {"size": 5000, "sort": ["_doc"]}))
    while page["hits"]["hits"]:
        out.update({h["_id"]: h["_source"] for h in page["hits"]["hits"]})
        more = {"scroll": "1m", "scroll_id": page["_scroll_id"]}
        page = json.loads(http(base, "/_search/scroll", more))
    return out


def delta_rows(flow: Any, table: str) -> dict[str, dict[str, Any]]:
    path = flow["root"] / f"{flow['schema']}.{table}"
    if not any((path / "_delta_log").glob("*.json")):  # not created yet, or being created
        return {}
    key = TABLES[table]
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {str(r[key]): {k: v for k, v in r.items() if k != "_walcast_lsn"} for r in rows}


def converge(
    flow: Any, procs: list[Proc], sink: str, read: Callable[[Any, str], dict[str, Any]]
) -> None:
    """Wait until every table's copy in ``sink`` equals Postgres; fail when the number of
    matching rows stops improving for 180 s (a loaded CI host is slow, not stuck),
    saying what differs."""
    want = {t: pg_rows(flow, t) for t in TABLES}
    best, last_progress = -1, time.monotonic()
    while True:
        got = {t: read(flow, t) for t in TABLES}
        if got == want:
            return
        good = sum(1 for t in TABLES for k, v in want[t].items() if got[t].get(k) == v)
        if good > best:
            best, last_progress = good, time.monotonic()
        dead = [p for p in procs if not p.alive()]
        assert not dead, f"{dead[0].log.name} exited:\n{dead[0].tail()}"
        if time.monotonic() - last_progress > 180:
            report = {
                t: {
                    "missing": len(set(want[t]) - set(got[t])),
                    "extra": len(set(got[t]) - set(want[t])),
                    "differ": sum(1 for k in want[t] if k in got[t] and got[t][k] != want[t][k]),
                }
                for t in TABLES
            }
            pytest.fail(f"{sink} != Postgres, no progress for 180 s: {report}")
        time.sleep(2)


def test_pgbench_reloads_under_primary_key_partitioning(
    flow: Any, procs: list[Proc], tmp_path: Path
) -> None:
    for service in ("pg2kafka", "kafka2search", "kafka2spark"):
        args = ["--env-file", str(flow["env_file"]), "run"]
        procs.append(Proc(service, args, flow[service], tmp_path / f"{service}.log"))
    pgbench = flow["pgbench"]
    for _ in range(3):
        pgbench.run("-i", "-I", "g", "-s", "1")  # TRUNCATE + COPY, one transaction
        pgbench.run("-n", "-c", "4", "-j", "2", "-t", "200")  # TPC-B
    converge(flow, procs, "the search index", index_rows)
    converge(flow, procs, "the Delta mirror", delta_rows)
    log = (tmp_path / "kafka2search.log").read_text(errors="replace")
    assert "truncated" in log  # the truncates did run, and removed only older rows
