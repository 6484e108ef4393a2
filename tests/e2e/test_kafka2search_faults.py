"""kafka2search as real processes under faults, fed by a real pg2kafka from Postgres:
kill -9 mid-bulk, two group members with rebalances mid-stream, the engine stopped for
30 s under load (memory bounded, nothing lost)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from services.kafka2search.engines import SearchEngine, engine_for
from services.kafka2search.settings import Kafka2SearchSettings
from services.pg2kafka import admin
from shared.settings import load_settings
from tests.e2e.conftest import REPO, Proc, pg2kafka_env, pg2kafka_settings, wait_until, write_rows


@pytest.fixture
def flow(stack_env: dict[str, str], unique_name: str) -> Any:
    """Postgres table → pg2kafka (3 partitions, primary-key keys) → kafka2search env."""
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    topic = f"{unique_name}.cdc"
    name = unique_name.replace("_", "-")
    pg_env = pg2kafka_env(unique_name, topic, "primary_key")
    search_env = {
        "KAFKA2SEARCH_CONSUMER__TOPICS": json.dumps([topic]),
        "KAFKA2SEARCH_CONSUMER__GROUP_ID": f"{name}-group",
        "KAFKA2SEARCH_CONSUMER__DLQ_TOPIC": f"{name}.dlq",
        "KAFKA2SEARCH_CONSUMER__SESSION_TIMEOUT_MS": "6000",
        "KAFKA2SEARCH_INDEX__NAME_TEMPLATE": f"{name}-{{table}}",
        "KAFKA2SEARCH_HTTP__PORT": "0",
        "KAFKA2SEARCH_LOG__FORMAT": "text",
    }
    pg = pg2kafka_settings(env_file, unique_name, topic, 3)
    search = load_settings(
        Kafka2SearchSettings, env_file=env_file,
        consumer={"topics": [topic], "group_id": f"{name}-group", "dlq_topic": f"{name}.dlq"},
        index={"name_template": f"{name}-{{table}}"},
    )  # fmt: skip
    table = f"{unique_name}_rows"
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL, pad text)")
    admin.init(pg)
    engine = engine_for(search.engine)
    yield {
        "env_file": env_file, "pg_env": pg_env, "search_env": search_env, "dsn": dsn,
        "table": table, "engine": engine, "alias": f"{name}-{table}".lower(), "search": search,
    }  # fmt: skip
    for _alias, index in engine.aliases(f"{name}-*").items():
        engine.delete_index(index)
    engine.close()
    admin.tear_down(pg)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {table}")
    client = AdminClient(pg.kafka.client_config())
    present = client.list_topics(timeout=10).topics
    gone = [t for t in (topic, f"{name}.dlq") if t in present]
    for fut in client.delete_topics(gone).values():
        fut.result(30)


def start(flow: Any, procs: list[Proc], tmp_path: Path, service: str, **extra: str) -> Proc:
    env = {**(flow["pg_env"] if service == "pg2kafka" else flow["search_env"]), **extra}
    p = Proc(service, ["--env-file", str(flow["env_file"]), "run"], env,
             tmp_path / f"{service}-{len(procs)}.log")  # fmt: skip
    procs.append(p)
    return p


def rows(flow: Any) -> dict[str, dict[str, Any]]:
    with psycopg.connect(flow["dsn"], autocommit=True) as c:
        cur = c.execute(f"SELECT id, to_jsonb(x) FROM {flow['table']} x")
        return {str(r[0]): r[1] for r in cur}


def docs(engine: SearchEngine, alias: str) -> dict[str, dict[str, Any]]:
    if engine.resolve_alias(alias) is None:
        return {}
    engine.refresh(alias)
    out: dict[str, dict[str, Any]] = {}
    body = {
        "size": 10000,
        "sort": ["_doc"],
        "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]},
    }  # the row alone
    answer = engine.request("POST", f"/{alias}/_search", body=body,
                            params={"scroll": "1m"})  # fmt: skip
    while answer["hits"]["hits"]:
        out.update({h["_id"]: h["_source"] for h in answer["hits"]["hits"]})
        more = {"scroll": "1m", "scroll_id": answer["_scroll_id"]}
        answer = engine.request("POST", "/_search/scroll", body=more)
    return out


def equal_eventually(flow: Any, procs: list[Proc], timeout: float) -> None:
    want = rows(flow)
    deadline = time.monotonic() + timeout
    got: dict[str, Any] = {}
    while time.monotonic() < deadline:
        got = docs(flow["engine"], flow["alias"])
        if got == want:
            return
        dead = [p for p in procs if not p.alive() and p.popen.returncode not in (0, -9)]
        assert not dead, dead[0].tail()
        time.sleep(1)
    missing = len(set(want) - set(got))
    differ = sum(1 for k in want if k in got and got[k] != want[k])
    pytest.fail(f"index != table after {timeout}s: {missing} missing, {differ} differ,"
                f" {len(set(got) - set(want))} extra")  # fmt: skip


def test_kill_9_mid_bulk_then_restart(flow: Any, procs: list[Proc], tmp_path: Path) -> None:
    start(flow, procs, tmp_path, "pg2kafka")
    write_rows(flow["dsn"], flow["table"], 1, 30000, updates=1)
    ix = start(flow, procs, tmp_path, "kafka2search", KAFKA2SEARCH_BATCH__MAX_DOCS="5000")
    engine, alias = flow["engine"], flow["alias"]

    def some() -> bool:
        try:
            return engine.resolve_alias(alias) is not None and engine.count(alias) > 0
        except Exception:  # noqa: BLE001 - a new index answers 503 until its shard is up
            return False

    wait_until(some, "the first documents", 60, interval=0.05)
    ix.kill9()
    write_rows(flow["dsn"], flow["table"], 30001, 5000)
    with psycopg.connect(flow["dsn"], autocommit=True) as c:
        c.execute(f"DELETE FROM {flow['table']} WHERE id % 7 = 0")
    start(flow, procs, tmp_path, "kafka2search")
    equal_eventually(flow, procs, 180)


def test_two_members_rebalance_mid_stream(flow: Any, procs: list[Proc], tmp_path: Path) -> None:
    def got_partitions(p: Proc) -> bool:
        return f"assigned {flow['pg_env']['PG2KAFKA_PRODUCER__TOPIC']}" in p.log.read_text(
            errors="replace"
        )

    start(flow, procs, tmp_path, "pg2kafka")
    a = start(flow, procs, tmp_path, "kafka2search")
    wait_until(lambda: got_partitions(a), "a to get the partitions", 60)
    write_rows(flow["dsn"], flow["table"], 1, 20000)
    b = start(flow, procs, tmp_path, "kafka2search")  # joins: partitions move to it
    write_rows(flow["dsn"], flow["table"], 20001, 20000, updates=2)
    wait_until(lambda: got_partitions(b), "b to take partitions from a", 60)
    assert "revoked" in a.log.read_text(errors="replace")
    write_rows(flow["dsn"], flow["table"], 40001, 10000, updates=1)
    a.stop()  # leaves: its partitions move to b after a flush
    write_rows(flow["dsn"], flow["table"], 50001, 10000, updates=1)
    with psycopg.connect(flow["dsn"], autocommit=True) as c:
        c.execute(f"DELETE FROM {flow['table']} WHERE id % 5 = 0")
    equal_eventually(flow, procs, 240)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _engine_pid() -> int:
    out = subprocess.run(
        [str(REPO / "deploy/local/walcast"), "status", "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    for c in json.loads(out.stdout)["components"]:
        if c["name"] == "opensearch":
            return int(c["pid"])
    raise AssertionError("no opensearch in the stack status")


def test_engine_stopped_30s_under_load(flow: Any, procs: list[Proc], tmp_path: Path) -> None:
    start(flow, procs, tmp_path, "pg2kafka")
    ix = start(flow, procs, tmp_path, "kafka2search",
               KAFKA2SEARCH_ENGINE__REQUEST_TIMEOUT_S="3",
               KAFKA2SEARCH_CONSUMER__MAX_QUEUE_BYTES=str(4 * 1024 * 1024))  # fmt: skip
    write_rows(flow["dsn"], flow["table"], 1, 5000)
    equal_eventually(flow, procs, 120)
    base_rss = _rss_kb(ix.pid)
    pid = _engine_pid()
    os.kill(pid, signal.SIGSTOP)
    peak = base_rss
    try:
        deadline = time.monotonic() + 30
        first = 5001
        while time.monotonic() < deadline:  # ~60k rows (~20 MB of events) during the stop
            write_rows(flow["dsn"], flow["table"], first, 2000, updates=1)
            first += 2000
            peak = max(peak, _rss_kb(ix.pid))
            time.sleep(0.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    equal_eventually(flow, procs, 300)
    grown_mb = (peak - base_rss) / 1024
    print(f"engine stopped 30 s: {first - 1} rows written, RSS {base_rss // 1024} MB →"
          f" peak {peak // 1024} MB (+{grown_mb:.1f} MB)")  # fmt: skip
    text = ix.log.read_text(errors="replace")
    assert "retrying" in text, "the outage should have been seen and retried"
    assert grown_mb < 64, f"RSS grew {grown_mb:.0f} MB during the outage"
