"""Subscription events survive a Kafka outage: queued in commit order while Kafka is down
(WAL released), replayed once it is back, nothing lost, same-row order kept; a restart
during the replay resumes it."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg.types.json import Jsonb

from services.pg2kafka import admin
from services.pg2kafka.settings import Pg2KafkaSettings
from tests.e2e.conftest import REPO, Proc, confirmed, pg2kafka_settings, wait_until

WALCAST = str(REPO / "deploy/local/walcast")


@pytest.fixture
def events_stream(stack_env: dict[str, str], unique_name: str) -> Any:
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    stream = 6 * 10**9 + uuid.uuid4().int % 10**9
    sub = {
        "enabled": True, "stream_id": stream, "slot": f"{unique_name}_ev",
        "publication": f"{unique_name}_ev", "topic": f"{unique_name}.events",
        "failover_after_s": 3, "probe_interval_s": 1, "replay_batch": 2000,
    }  # fmt: skip
    env = {
        "PG2KAFKA_REPLICATION__SLOT": unique_name,
        "PG2KAFKA_REPLICATION__PUBLICATION": unique_name,
        "PG2KAFKA_REPLICATION__STATUS_INTERVAL_S": "0.5",
        "PG2KAFKA_FILTERS__INCLUDE": f'["public.{unique_name}_none"]',
        "PG2KAFKA_PRODUCER__TOPIC": f"{unique_name}.cdc",
        "PG2KAFKA_PRODUCER__CREATE_TOPIC": "true",
        "PG2KAFKA_PRODUCER__TOPIC_PARTITIONS": "1",
        "PG2KAFKA_HTTP__PORT": "0",
        "PG2KAFKA_LOG__FORMAT": "text",
        **{
            f"PG2KAFKA_SUBSCRIPTIONS__{k.upper()}": str(v).lower()
            if isinstance(v, bool)
            else str(v)
            for k, v in sub.items()
        },
    }
    settings = pg2kafka_settings(
        env_file,
        unique_name,
        f"{unique_name}.cdc",
        1,
        filters={"include": [f"public.{unique_name}_none"]},
        subscriptions=sub,
    )
    table = f"{unique_name}_rows"
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int NOT NULL)")
    admin.init(settings)
    with psycopg.connect(dsn, autocommit=True) as c:
        for op in ("INSERT", "UPDATE"):
            c.execute(
                "INSERT INTO _walcast.subscriptions (key, stream_id, operation, schema_name,"
                " table_name, column_names, payload_extensions) VALUES (%s, %s, %s, 'public',"
                " %s, %s, %s)",
                [
                    f"{unique_name}:{op}",
                    stream,
                    op,
                    table,
                    ["id", "v"],
                    Jsonb([{"json_path": "group_id", "expression": "new.id::text"}]),
                ],
            )
    yield {
        "env": env,
        "env_file": env_file,
        "settings": settings,
        "dsn": dsn,
        "table": table,
        "stream": stream,
    }
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM _walcast.streams WHERE id = %s", [stream])
        c.execute("DELETE FROM _walcast.events WHERE stream_id = %s", [stream])
        c.execute("DELETE FROM _walcast.replay_queue WHERE stream_id = %s", [stream])
        c.execute(f"DROP TABLE {table}")
    admin.tear_down(settings)
    client = AdminClient(settings.kafka.client_config())
    topics = [
        t
        for t in (f"{unique_name}.cdc", f"{unique_name}.events")
        if t in client.list_topics(timeout=10).topics
    ]
    for fut in client.delete_topics(topics).values():
        fut.result(30)


def start(es: Any, procs: list[Proc], tmp_path: Path) -> Proc:
    p = Proc(
        "pg2kafka",
        ["--env-file", str(es["env_file"]), "run"],
        es["env"],
        tmp_path / f"pg2kafka-{len(procs)}.log",
    )
    procs.append(p)
    return p


def kafka(action: str) -> None:
    proc = subprocess.run(
        [WALCAST, action, *(["kafka"] if action == "down" else [])],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def delivered(settings: Pg2KafkaSettings, want: int, timeout: float) -> list[dict[str, Any]]:
    """Every event record of the topic, in offset order, once ``want`` distinct ids came."""
    topic = settings.subscriptions.topic
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"{topic}-verify",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
    out: list[dict[str, Any]] = []
    ids: set[bytes] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(ids) < want and time.monotonic() < deadline:
            for msg in consumer.consume(5000, 1.0):
                if msg.error():
                    continue
                headers = dict(msg.headers() or [])
                ids.add(headers["walcast-event-id"])
                out.append(
                    {
                        "id": headers["walcast-event-id"],
                        "key": msg.key(),
                        "partition": msg.partition(),
                        **orjson.loads(msg.value()),
                    }
                )
    finally:
        consumer.close()
    assert len(ids) == want, f"{len(ids)} of {want} events delivered"
    return out


def check_rows(events: list[dict[str, Any]], rows: int, updates: int) -> int:
    """Per row: the versions 0..updates, in order (duplicates are same-id redeliveries)."""
    seen: dict[bytes, Any] = {}
    per_row: dict[int, list[int]] = defaultdict(list)
    dups = 0
    for ev in events:
        if ev["id"] in seen:
            dups += 1
            continue
        seen[ev["id"]] = ev
        per_row[ev["new"]["id"]].append(ev["new"]["v"])
    assert len(per_row) == rows
    bad = {r: vs for r, vs in per_row.items() if vs != list(range(updates + 1))}
    assert not bad, f"{len(bad)} rows out of order, e.g. {next(iter(bad.items()))}"
    return dups


def test_outage_with_interleaved_writers_loses_nothing(
    events_stream: Any, procs: list[Proc], tmp_path: Path
) -> None:
    es = events_stream
    dsn, table = es["dsn"], es["table"]
    writers, rows_per_writer, updates = 4, 100, 124  # 4*100*(1+124) = 50,000 events
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, %s::int) g",
            [writers * rows_per_writer],
        )
    proc = start(es, procs, tmp_path)
    wait_until(lambda: "leader for slot" in proc.log.read_text(errors="replace"), "leader", 30)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        """Two sessions per writer: the first opens its transaction before the second
        and commits after it, so insert order and commit order differ."""
        try:
            ids = list(range(w * rows_per_writer + 1, (w + 1) * rows_per_writer + 1))
            with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
                for _ in range(updates):
                    for i in range(0, len(ids), 2):
                        a.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", [ids[i]])
                        b.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", [ids[i + 1]])
                        b.commit()
                        a.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    time.sleep(2)  # let some events flow live first
    kafka("down")
    try:
        before = confirmed(dsn, es["settings"].subscriptions.slot)
        wait_until(
            lambda: "queueing events" in proc.log.read_text(errors="replace"),
            "the stream to switch to the replay queue",
            60,
        )
        # WAL is released while Kafka is down: the slot keeps moving.
        wait_until(
            lambda: confirmed(dsn, es["settings"].subscriptions.slot) > before,
            "the slot to advance during the outage",
            60,
        )
        time.sleep(5)
    finally:
        kafka("up")
    for t in threads:
        t.join()
    assert not errors, errors
    events = delivered(es["settings"], writers * rows_per_writer * (1 + updates), 300)
    dups = check_rows(events, writers * rows_per_writer, updates)
    text = proc.log.read_text(errors="replace")
    assert "replay done" in text
    print(f"outage: 50,000 events, all delivered in per-row order, {dups} redeliveries")


def test_restart_during_replay_resumes_it(
    events_stream: Any, procs: list[Proc], tmp_path: Path
) -> None:
    es = events_stream
    dsn, table = es["dsn"], es["table"]
    rows, updates = 200, 49  # 10,000 events
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, %s::int) g", [rows])
    kafka("down")
    try:
        proc = start(es, procs, tmp_path)
        wait_until(
            lambda: "queueing events" in proc.log.read_text(errors="replace"), "queueing", 90
        )
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(updates):
                c.execute(f"UPDATE {table} SET v = v + 1")

        def queued() -> int:
            with psycopg.connect(dsn, autocommit=True) as c:
                row = c.execute(
                    "SELECT count(*) FROM _walcast.replay_queue WHERE stream_id = %s",
                    [es["stream"]],
                ).fetchone()
                return int(row[0]) if row else 0

        wait_until(lambda: queued() >= rows * (1 + updates), "every event queued", 90)
    finally:
        kafka("up")
    wait_until(
        lambda: "replayed" in proc.log.read_text(errors="replace"),
        "replay start",
        60,
        interval=0.05,
    )
    proc.kill9()
    with psycopg.connect(dsn, autocommit=True) as c:
        left = c.execute(
            "SELECT count(*) FROM _walcast.replay_queue WHERE stream_id = %s", [es["stream"]]
        ).fetchone()
    proc = start(es, procs, tmp_path)
    events = delivered(es["settings"], rows * (1 + updates), 180)
    check_rows(events, rows, updates)
    wait_until(lambda: "replay done" in proc.log.read_text(errors="replace"), "done", 60)
    print(f"restart during replay: {left[0] if left else '?'} events were left in the queue")


def invalidate_slots(dsn: str, slot: str) -> None:
    """Make ``slot`` fall behind ``max_slot_wal_keep_size`` and be invalidated (every
    inactive slot that lags as far goes with it), then restore the setting."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        c.execute("SELECT pg_reload_conf()")
        c.execute("CREATE TEMP TABLE wal_filler (x text)")
        try:

            def lost() -> bool:
                c.execute(
                    "INSERT INTO wal_filler SELECT repeat('x', 100) FROM generate_series(1, 20000)"
                )
                c.execute("SELECT pg_switch_wal()")
                c.execute("CHECKPOINT")
                row = c.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", [slot]
                ).fetchone()
                return row is not None and row[0] == "lost"

            wait_until(lost, f"slot {slot} to be invalidated", 60)
        finally:
            c.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            c.execute("SELECT pg_reload_conf()")


def interleaved_updates(dsn: str, table: str, ids: list[int]) -> None:
    """One version more for each row; the first session opens its transaction before the
    second and commits after it, so insert order and commit order differ."""
    with psycopg.connect(dsn) as a, psycopg.connect(dsn) as b:
        for i in range(0, len(ids), 2):
            a.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", [ids[i]])
            b.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", [ids[i + 1]])
            b.commit()
            a.commit()


def stream_event_ids(dsn: str, stream: int) -> set[bytes]:
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute("SELECT id FROM _walcast.events WHERE stream_id = %s", [stream])
        return {str(r[0]).encode() for r in rows}


def test_invalidated_slot_is_recovered_from_the_events_table(
    events_stream: Any, procs: list[Proc], tmp_path: Path
) -> None:
    es = events_stream
    dsn, table, stream = es["dsn"], es["table"], es["stream"]
    settings: Pg2KafkaSettings = es["settings"]
    slot = settings.subscriptions.slot
    rows = 100
    ids = list(range(1, rows + 1))
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, %s::int) g", [rows])
        c.execute(f"UPDATE {table} SET v = v + 1")
    proc = start(es, procs, tmp_path)
    phase1 = stream_event_ids(dsn, stream)
    assert len(phase1) == 2 * rows

    def snapshot_covers_phase1() -> bool:
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute(
                "SELECT bool_and(pg_visible_in_snapshot(e.xid, s.delivered_snapshot))"
                " FROM _walcast.events e JOIN _walcast.streams s ON s.id = e.stream_id"
                " WHERE e.stream_id = %s",
                [stream],
            ).fetchone()
            return bool(row and row[0])

    wait_until(snapshot_covers_phase1, "a delivered snapshot covering the first events", 60)
    assert admin.status(settings)["subscription_events"]["delivered_snapshot_at"] is not None
    proc.stop()

    # While pg2kafka is away: interleaved commits; then, after the invalidation, a manual
    # event written by a transaction that stays open until the recovery has begun.
    for _ in range(4):
        interleaved_updates(dsn, table, ids)
    invalidate_slots(dsn, slot)
    # The CDC slot of this pg2kafka lagged as far: give it a new one (not under test).
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot(%s)", [settings.replication.slot])
    admin.init(settings)
    late = psycopg.connect(dsn)
    try:
        late.execute(
            "INSERT INTO _walcast.events (payload, stream_id) VALUES (%s, %s)",
            [Jsonb({"manual": "late"}), stream],
        )
        proc = start(es, procs, tmp_path)
        wait_until(lambda: "unusable" in proc.log.read_text(errors="replace"), "recovery", 60)
        late.commit()  # creating the new slot waits for this transaction
    finally:
        late.close()
    wait_until(lambda: "recreated" in proc.log.read_text(errors="replace"), "new slot", 60)
    # Live again on the new slot.
    interleaved_updates(dsn, table, ids)
    everything = stream_event_ids(dsn, stream)
    assert len(everything) == 2 * rows + 5 * rows + 1
    events = delivered(settings, len(everything), 180)
    assert {e["id"] for e in events} == everything
    changes = [e for e in events if "new" in e]
    check_rows(changes, rows, 6)
    resent = [e["id"] for e in events].count
    assert all(resent(i) == 1 for i in phase1), "events behind the delivered snapshot resent"
    wait_until(lambda: "replay done" in proc.log.read_text(errors="replace"), "replay done", 60)
    with psycopg.connect(dsn, autocommit=True) as c:
        state = c.execute(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
        checkpoint = c.execute(
            "SELECT failover_checkpoint FROM _walcast.streams WHERE id = %s", [stream]
        ).fetchone()
    assert state is not None
    assert state[0] != "lost"
    assert checkpoint == (None,)


def test_recovery_cut_short_is_redone(
    events_stream: Any, procs: list[Proc], tmp_path: Path
) -> None:
    """A crash after the old slot was dropped, before the queue was rebuilt: the mark in
    the checkpoint makes the next start redo the recovery, so nothing is lost."""
    es = events_stream
    dsn, table, stream = es["dsn"], es["table"], es["stream"]
    settings: Pg2KafkaSettings = es["settings"]
    rows = 50
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, %s::int) g", [rows])
        c.execute(
            "UPDATE _walcast.streams SET failover_checkpoint ="
            ' \'{"reason": "test", "recovering": true}\' WHERE id = %s',
            [stream],
        )
        c.execute("SELECT pg_drop_replication_slot(%s)", [settings.subscriptions.slot])
        c.execute(f"UPDATE {table} SET v = v + 1")
    proc = start(es, procs, tmp_path)
    events = delivered(settings, 2 * rows, 120)
    check_rows([e for e in events if "new" in e], rows, 1)
    wait_until(lambda: "replay done" in proc.log.read_text(errors="replace"), "replay done", 60)
