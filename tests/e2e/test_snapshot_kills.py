"""Kills at the worst moments of a snapshot, driven by failpoints (shared/failpoints.py),
not by timing; the sinks compared with Postgres by code that uses no walcast module
(plain SQL, plain HTTP to the engine, the ``deltalake`` reader).

- A table created *after* the slot, filled, then given its key (``pgbench -i``'s and
  ``pg_restore``'s order) is snapshotted incrementally; pg2kafka dies at a chunk boundary
  while a transaction that began before the table existed is still open (the slot's
  restart position stays below the table's creation); it is restarted, and the resumed
  chunks must still reach every sink: their rows must carry a version above the table's
  creation, which sinks treat as the table's floor.
- pg2kafka killed at every chunk boundary of an incremental and of an initial snapshot:
  each restart resumes, without an unhandled error, and nothing is lost.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from services.pg2kafka import admin
from tests.e2e.conftest import Proc, confirmed, pg2kafka_settings, wait_until
from tests.integration.conftest import difference, env_file, tear_down  # noqa: F401 - fixture
from tests.integration.kafka2search.conftest import (  # noqa: F401 - fixtures
    IndexerFactory,
    engine_kind,
    make_indexer,
)

pytestmark = pytest.mark.e2e

EXIT = 86  # shared.failpoints.EXIT_CODE, restated: the test does not import walcast's


def sql(dsn: str, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(statement, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def topic_events(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every record of the topic, decoded with nothing but json."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-check",
                  "enable.auto.commit": False, "enable.partition.eof": True})  # fmt: skip
    meta = c.list_topics(topic, timeout=10).topics[topic]
    parts = list(meta.partitions)
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[dict[str, Any]] = []
    left = set(parts)
    deadline = time.monotonic() + 60
    while left and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            left.discard(msg.partition())
            continue
        out.append(json.loads(msg.value()))
    c.close()
    return out


def engine_docs(url: str, alias: str) -> dict[str, dict[str, Any]]:
    """Every document under ``alias`` by id, with plain HTTP (a scroll)."""

    def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(url.rstrip("/") + path, method=method,  # noqa: S310
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - the stack's URL
            return json.loads(r.read() or b"{}")

    call("POST", f"/{alias}/_refresh")
    out: dict[str, dict[str, Any]] = {}
    page = call(
        "POST",
        f"/{alias}/_search?scroll=2m",
        {
            "size": 5000,
            "sort": ["_doc"],
            "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]},
        },
    )
    while page["hits"]["hits"]:
        out.update({h["_id"]: h["_source"] for h in page["hits"]["hits"]})
        page = call("POST", "/_search/scroll", {"scroll": "2m", "scroll_id": page["_scroll_id"]})
    return out


def caught_up(bootstrap: str, group: str, topic: str) -> bool:
    """The group committed the end of every partition of the topic."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                  "enable.auto.commit": False})  # fmt: skip
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        done = c.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        for tp in done:
            low, high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            if high > low and tp.offset < high:  # an empty partition has nothing to commit
                return False
        return True
    finally:
        c.close()


class Stream:
    """pg2kafka processes streaming one slot into one topic, one after another."""

    def __init__(self, stack_env: dict[str, str], name: str, tmp: Path, key: str,
                 **snapshot: Any) -> None:  # fmt: skip
        self.env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
        self.dsn = stack_env["WALCAST_PG_DSN"]
        self.schema = f"s_{name}"
        self.topic = f"{name}.cdc"
        self.tmp = tmp
        self.settings = pg2kafka_settings(
            self.env_file, name, self.topic, 3,
            snapshot={"chunk_rows": 400, "workers": 2, **snapshot},
            filters={"include": [f"{self.schema}.*"]},
        )  # fmt: skip
        self.env = {
            "PG2KAFKA_REPLICATION__SLOT": name,
            "PG2KAFKA_REPLICATION__PUBLICATION": name,
            "PG2KAFKA_PRODUCER__TOPIC": self.topic,
            "PG2KAFKA_PRODUCER__PARTITION_KEY": key,
            "PG2KAFKA_FILTERS__INCLUDE": json.dumps([f"{self.schema}.*"]),
            "PG2KAFKA_HTTP__ENABLED": "false",
            "PG2KAFKA_REPLICATION__STATUS_INTERVAL_S": "0.5",
            "PG2KAFKA_LOG__FORMAT": "text",
            **{f"PG2KAFKA_SNAPSHOT__{k.upper()}": str(v).lower() if isinstance(v, bool)
               else str(v) for k, v in {"chunk_rows": 400, "workers": 2, **snapshot}.items()},
        }  # fmt: skip
        self.procs: list[Proc] = []

    def start(self, failpoints: str = "") -> Proc:
        env = {**self.env, "WALCAST_FAILPOINTS": failpoints}
        p = Proc("pg2kafka", ["--env-file", str(self.env_file), "run"], env,
                 self.tmp / f"pg2kafka-{len(self.procs)}.log")  # fmt: skip
        self.procs.append(p)
        return p

    def died_at_failpoint(self, p: Proc, timeout: float = 180) -> None:
        wait_until(lambda: not p.alive(), f"pg2kafka to reach its failpoint\n{p.tail()}",
                   timeout)  # fmt: skip
        code = p.popen.returncode
        assert code == EXIT, f"exit {code}, not the failpoint's\n{p.tail()}"

    def run_state(self) -> str:
        runs = admin.snapshot_status(self.settings)
        return str(runs[0]["state"]) if runs else "none"

    def logs(self) -> str:
        return "\n".join(p.log.read_text(errors="replace") for p in self.procs)

    def close(self) -> None:
        for p in self.procs:
            p.stop()
        tear_down(self.settings)
        client = AdminClient({"bootstrap.servers": self.settings.kafka.bootstrap_servers})
        client.delete_topics([self.topic])[self.topic].result(30)
        sql(self.dsn, f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def no_unhandled_errors(stream: Stream) -> None:
    text = stream.logs()
    assert "Traceback" not in text, text[-3000:]
    assert "stopping: (" not in text, "a bare exception repr as the reason to stop"


@pytest.mark.parametrize("key", ["schema", "primary_key"])
def test_a_kill_mid_snapshot_of_a_table_created_after_the_slot_loses_nothing(
    stack_env: dict[str, str],
    make_indexer: IndexerFactory,  # noqa: F811
    engine_kind: str,  # noqa: F811
    unique_name: str,
    tmp_path: Path,
    key: str,
) -> None:
    s = Stream(stack_env, unique_name, tmp_path, key, mode="never", automatic=True)
    indexers: list[Any] = []
    try:
        sql(s.dsn, f'CREATE SCHEMA "{s.schema}"')
        admin.init(s.settings)
        ix = make_indexer(s.topic).start()
        indexers.append(ix)
        first = s.start("incremental.chunk_done=exit@3")
        wait_until(lambda: bool(sql(
            s.dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
            [s.settings.replication.slot])), "pg2kafka streaming", 60)  # fmt: skip
        # A transaction from before the table exists keeps the slot's restart position
        # below its creation until the end (the worst case for the resumed chunks).
        with psycopg.connect(s.dsn, autocommit=True) as old:
            old.execute("BEGIN")
            old.execute("SELECT pg_current_xact_id()")
            t = f'"{s.schema}".accounts'
            sql(s.dsn, f"CREATE TABLE {t} (aid int NOT NULL, bal int, filler text)")
            sql(s.dsn, f"INSERT INTO {t} SELECT g, 0, repeat('f', 80)"
                       " FROM generate_series(1, 4000) g")  # fmt: skip
            # The slot is confirmed past the creation before the key is added (a long load
            # between them, as pgbench -i's): a restart no longer streams the creation.
            created = int(sql(s.dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
            wait_until(lambda: confirmed(s.dsn, s.settings.replication.slot) > created,
                       "the slot confirmed past the table's creation", 120)  # fmt: skip
            sql(s.dsn, f"ALTER TABLE {t} ADD PRIMARY KEY (aid)")  # joins: snapshot asked
            s.died_at_failpoint(first)
            sql(s.dsn, f"UPDATE {t} SET bal = bal + 1 WHERE aid % 7 = 0")
            sql(s.dsn, f"DELETE FROM {t} WHERE aid % 11 = 0")
            s.start()
            wait_until(lambda: s.run_state() == "done", "the resumed snapshot done", 180)
            old.execute("COMMIT")
        sql(s.dsn, f"UPDATE {t} SET filler = 'last' WHERE aid = 1")
        want = {str(r[0]): {"aid": r[0], "bal": r[1], "filler": r[2]}
                for r in sql(s.dsn, f"SELECT aid, bal, filler FROM {t}")}  # fmt: skip
        url = ix.settings.engine.urls[0]
        alias = ix.alias("accounts", s.schema)
        deadline = time.monotonic() + 180
        while (got := engine_docs(url, alias)) != want and time.monotonic() < deadline:
            time.sleep(1)
        if difference(want, got) != ([], [], []):
            events = topic_events(s.settings.kafka.bootstrap_servers, s.topic)
            versions = sorted({e["lsn"] for e in events if e["op"] == "read"})
            pytest.fail(f"the index holds {len(got)} of {len(want)} rows; the read rows'"
                        f" versions {versions}, the table created at {created}")  # fmt: skip
        # What the sink rebuilds after a restart (its floors read back from the engine)
        # must equal what it held in memory: a fresh consumer group replays the whole
        # topic into the same index, and the index still equals the table.
        ix.stop()
        group = f"{unique_name}-again"
        again = make_indexer(s.topic, consumer={"group_id": group}).start()
        indexers.append(again)
        again.wait(lambda: caught_up(s.settings.kafka.bootstrap_servers, group, s.topic),
                   "the replay to reach the topic's end", timeout=180)  # fmt: skip
        again.stop()
        got = engine_docs(url, alias)
        assert difference(want, got) == ([], [], []), "the replay after a restart differs"
        no_unhandled_errors(s)
    finally:
        for one in indexers:  # before their topic goes
            one.stop()
        s.close()


def newest_per_key(events: list[dict[str, Any]], table: str) -> dict[str, dict[str, Any]]:
    """What a sink keeping the newest version of each row ends with, from the events
    alone: writes newer than what is held win, a delete forgets the row, a truncate or a
    snapshot's end removes what is older than it."""
    held: dict[str, tuple[int, int, dict[str, Any] | None]] = {}
    for e in events:
        if e.get("table") != table:
            continue
        v = (e.get("epoch", 0), e["lsn"])
        if e["op"] == "truncate" or (e["op"] == "snapshot" and e["snapshot"]["phase"] == "end"):
            held = {k: h for k, h in held.items() if (h[0], h[1]) >= v}
        elif e["op"] in ("insert", "update", "read", "delete"):
            k = json.dumps(e["key"], sort_keys=True)
            if k not in held or v > (held[k][0], held[k][1]):
                held[k] = (v[0], v[1], None if e["op"] == "delete" else e["new"])
    return {k: h[2] for k, h in held.items() if h[2] is not None}


def run_to_the_end(s: Stream, places: list[str], limit: int) -> int:
    """Start pg2kafka again and again, each armed to die at the next place in turn, until
    the snapshot run is done; the number of kills."""
    kills = 0
    while s.run_state() != "done":
        assert kills < limit, f"the run is not done after {kills} kills\n{s.procs[-1].tail()}"
        place = places[kills % len(places)]
        p = s.start(f"{place}=exit@1")

        def over(p: Proc = p) -> bool:
            return not p.alive() or s.run_state() == "done"

        wait_until(over, f"pg2kafka to die at {place} or finish\n{p.tail()}", 180)
        if not p.alive():
            code = p.popen.returncode
            assert code == EXIT, f"exit {code}, not the failpoint's\n{p.tail()}"
            kills += 1
        else:
            p.stop()
    return kills


def test_a_kill_at_every_chunk_boundary_of_both_snapshots_resumes_and_loses_nothing(
    stack_env: dict[str, str], unique_name: str, tmp_path: Path
) -> None:
    """The initial snapshot, then an incremental one asked for by the CLI, with writes
    between the restarts: each chunk boundary (read, sent and not yet recorded, recorded)
    is a kill; every restart resumes without an unhandled error, and the topic alone
    brings a sink to the table's state."""
    s = Stream(stack_env, unique_name, tmp_path, "primary_key", mode="initial", chunk_pages=20)
    try:
        t = f'"{s.schema}".items'
        sql(s.dsn, f'CREATE SCHEMA "{s.schema}"')
        sql(s.dsn, f"CREATE TABLE {t} (id int PRIMARY KEY, v int, pad text)")
        sql(s.dsn, f"INSERT INTO {t} SELECT g, 0, repeat('p', 300)"
                   " FROM generate_series(1, 3000) g")  # fmt: skip
        admin.init(s.settings)
        kills = run_to_the_end(s, ["snapshot.chunk_sent", "snapshot.chunk_done"], 40)
        assert kills >= 4, f"only {kills} kills: the snapshot had too few chunks to test"
        sql(s.dsn, f"UPDATE {t} SET v = v + 1 WHERE id % 5 = 0")
        last = s.start()
        bootstrap = s.settings.kafka.bootstrap_servers
        wait_until(lambda: any(e["op"] == "update" for e in topic_events(bootstrap, s.topic)),
                   "the stream after the snapshot")  # fmt: skip
        last.stop()
        runs = len(admin.snapshot_status(s.settings))
        admin.snapshot_request(s.settings, [f"{s.schema}.items"])
        places = ["incremental.chunk_read", "incremental.chunk_sent", "incremental.chunk_done"]
        restarts = 0
        while len(admin.snapshot_status(s.settings)) == runs or s.run_state() != "done":
            # Writes between the restarts: rows change inside and between the windows.
            sql(s.dsn, f"DELETE FROM {t} WHERE id IN (SELECT id FROM {t} ORDER BY random()"
                       " LIMIT 20)")  # fmt: skip
            sql(s.dsn, f"UPDATE {t} SET v = v + 10 WHERE id IN (SELECT id FROM {t}"
                       " ORDER BY random() LIMIT 50)")  # fmt: skip
            place = places[restarts % len(places)]
            p = s.start(f"{place}=exit@1")

            def over(p: Proc = p) -> bool:
                return not p.alive() or (
                    len(admin.snapshot_status(s.settings)) > runs and s.run_state() == "done"
                )

            wait_until(over, f"pg2kafka to die at {place} or finish\n{p.tail()}", 180)
            if p.alive():
                p.stop()
            else:
                code = p.popen.returncode
                assert code == EXIT, f"exit {code}, not the failpoint's\n{p.tail()}"
                kills += 1
            restarts += 1
            assert restarts < 120, "the incremental run did not finish"
        sql(s.dsn, f"INSERT INTO {t} VALUES (-1, 0, 'last')")
        final = s.start()
        events: list[dict[str, Any]] = []

        def last_seen() -> bool:
            events[:] = topic_events(s.settings.kafka.bootstrap_servers, s.topic)
            return any(e["op"] == "insert" and e["key"] == {"id": -1} for e in events)

        wait_until(last_seen, "the last insert", 120)
        final.stop()
        want = {json.dumps({"id": r[0]}): {"id": r[0], "v": r[1], "pad": r[2]}
                for r in sql(s.dsn, f"SELECT id, v, pad FROM {t}")}  # fmt: skip
        got = newest_per_key(events, "items")
        assert difference(want, got) == ([], [], [])
        no_unhandled_errors(s)
    finally:
        s.close()
