"""pg2kafka streams its stream's subscription events to the events topic."""

from __future__ import annotations

import json
import random
import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from psycopg.types.json import Jsonb

from services.pg2kafka import admin, event_records, replay
from services.pg2kafka.app import build
from services.pg2kafka.subscriptions import SubscriptionStream
from tests.integration.conftest import Harness, HarnessFactory


def test_events_reach_their_topic_with_key_and_headers(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    stream = random.randint(2 * 10**9, 3 * 10**9)
    other = stream + 1
    h = make_harness(
        init=False,
        subscriptions={
            "enabled": True, "stream_id": stream, "slot": f"{unique_name}_ev",
            "publication": f"{unique_name}_ev", "topic": f"{unique_name}.events",
            "key_field": "group_id", "maintenance_interval_s": 3600,
        },
    )  # fmt: skip
    s = unique_name
    h.sql(f"CREATE SCHEMA {s}")
    h.sql(f"CREATE TABLE {s}.orders (id int PRIMARY KEY, user_id int, total numeric(10,2))")
    report = admin.init(h.settings)
    assert f"slot {unique_name}_ev" in report.created
    h.sql("INSERT INTO _walcast.streams (id) VALUES (%s) ON CONFLICT DO NOTHING", [other])
    try:
        h.sql(
            "INSERT INTO _walcast.subscriptions (key, stream_id, operation, schema_name,"
            " table_name, column_names, payload_extensions, metadata)"
            " VALUES (%s, %s, 'INSERT', %s, 'orders', %s, %s, %s)",
            [
                f"{s}:order-notification",
                stream,
                s,
                ["id", "user_id", "total"],
                Jsonb(
                    [
                        {"json_path": "group_id", "expression": "new.user_id::text"},
                        {"json_path": "queue_name", "expression": "'order-notifications'"},
                    ]
                ),
                Jsonb({"topic": "orders", "priority": {"level": 1}}),
            ],
        )
        h.start()
        h.sql(f"INSERT INTO {s}.orders VALUES (1, 42, 10.5), (2, 43, 99.99)")
        h.sql(
            "INSERT INTO _walcast.events (payload, stream_id) VALUES (%s, %s)",
            [Jsonb({"type": "manual", "n": 1}), stream],
        )
        h.sql(
            "INSERT INTO _walcast.events (payload, stream_id) VALUES (%s, %s)",
            [Jsonb({"type": "not-ours"}), other],
        )  # another stream: not delivered
        # A number beyond a double's range (jsonb holds any numeric) used to stop the
        # events stream and CDC with it.
        h.sql(
            "INSERT INTO _walcast.events (payload, stream_id) VALUES (%s::jsonb, %s)",
            ['{"group_id": 1e309, "big": 12345678901234567.89}', stream],
        )
        got: list[dict[str, Any]] = []
        consumer = Consumer(
            {
                "bootstrap.servers": h.settings.kafka.bootstrap_servers,
                "group.id": f"{unique_name}-ev",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([f"{unique_name}.events"])
        deadline = time.monotonic() + 60
        try:
            while len(got) < 4 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                got.append(
                    {
                        "key": msg.key(),
                        "value": json.loads(msg.value(), parse_float=Decimal),
                        "headers": dict(msg.headers() or []),
                    }
                )
            extra = consumer.poll(2.0)  # nothing else may arrive
        finally:
            consumer.close()
        assert extra is None or extra.error()
        by_key = {g["key"]: g for g in got}
        huge = b"1" + b"0" * 309
        assert set(by_key) == {b"42", b"43", None, huge}
        assert by_key[huge]["value"]["big"] == Decimal("12345678901234567.89")
        assert by_key[huge]["value"]["group_id"] == Decimal(10) ** 309
        order = by_key[b"42"]
        assert order["value"]["new"] == {"id": 1, "user_id": 42, "total": Decimal("10.5")}
        assert order["value"]["queue_name"] == "order-notifications"
        assert order["headers"]["topic"] == b"orders"
        assert order["headers"]["priority"] == b'{"level":1}'
        assert order["headers"]["walcast-stream-id"] == str(stream).encode()
        assert by_key[None]["value"] == {"type": "manual", "n": 1}
        # status shows the partitions and the next maintenance
        info = admin.status(h.settings)["subscription_events"]
        assert len(info["partitions"]) >= 8
        assert info["next_maintenance_at"] is not None
        assert info["subscriptions"] == 1
    finally:
        h.stop()
        h.sql("DELETE FROM _walcast.streams WHERE id IN (%s, %s)", [stream, other])
        h.sql("DELETE FROM _walcast.events WHERE stream_id IN (%s, %s)", [stream, other])
        h.sql(f"DROP SCHEMA {s} CASCADE")
        admin.tear_down(h.settings)
        client = AdminClient(h.settings.kafka.client_config())
        topic = f"{unique_name}.events"
        if topic in client.list_topics(timeout=10).topics:
            client.delete_topics([topic])[topic].result(30)


def test_a_second_failure_keeps_the_first_checkpoint(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    stream = 3 * 10**9 + random.randint(0, 10**8)
    h = make_harness(
        subscriptions={
            "enabled": True,
            "stream_id": stream,
            "slot": f"{unique_name}_ev",
            "publication": f"{unique_name}_ev",
            "topic": f"{unique_name}.events",
        },
    )
    try:
        events = build(h.settings).events
        assert isinstance(events, SubscriptionStream)
        assert events.checkpoint() is None
        events.set_checkpoint("first outage")
        first = events.checkpoint()
        events.set_checkpoint("second outage, during the replay")
        assert events.checkpoint() == first
        assert first["reason"] == "first outage"
        assert first["slot_lsn"]  # the slot position when the first failure happened
    finally:
        h.sql("DELETE FROM _walcast.streams WHERE id = %s", [stream])
        admin.tear_down(h.settings)


def test_a_replay_says_when_queued_events_are_gone(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """Before: the replay's inner join skipped events whose partition had been dropped,
    with no log and no metric."""
    stream = 5 * 10**9 + random.randint(0, 10**8)
    topic = f"{unique_name}.events"
    h = make_harness(
        subscriptions={"enabled": True, "stream_id": stream, "slot": f"{unique_name}_ev",
                       "publication": f"{unique_name}_ev", "topic": topic},
    )  # fmt: skip
    try:
        events = build(h.settings).events
        assert isinstance(events, SubscriptionStream)
        h.sql(
            "INSERT INTO _walcast.events (payload, stream_id) VALUES ('{\"n\": 1}', %s)", [stream]
        )
        h.sql(
            "INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
            " SELECT %s, created_at, id FROM _walcast.events WHERE stream_id = %s",
            [stream, stream],
        )
        h.sql(  # an event whose partition is gone
            "INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
            " VALUES (%s, now() - interval '400 days', -1)",
            [stream],
        )
        events.set_checkpoint("a test outage")
        done = replay.replay_queue(
            h.settings, events.target, events.metrics, threading.Event(), lambda: None
        )
        assert done
        assert events.metrics.replay_missing._value.get() == 1
        assert events.metrics.replayed._value.get() >= 1
        assert events.checkpoint() is None  # live again, the gap said and counted
    finally:
        _forget_stream(h, stream, topic)


@pytest.mark.parametrize("key_field", ["group_id", "meta.group", "items.0", None])
def test_a_replay_sends_what_the_live_path_sends(
    make_harness: HarnessFactory, unique_name: str, key_field: str | None
) -> None:
    """The replay has Postgres write each record's value and, where its bytes are sure to
    match, its key; every record must equal what the live path
    (:func:`event_records.event_message`, from the same row) makes of it: key, value and
    headers, for keys of every JSON type, nested key fields, a key field that looks like
    an array index, payloads that are not objects, and metadata of every shape."""
    stream = 6 * 10**9 + random.randint(0, 10**8)
    topic = f"{unique_name}.events"
    h = make_harness(
        subscriptions={"enabled": True, "stream_id": stream, "slot": f"{unique_name}_ev",
                       "publication": f"{unique_name}_ev", "topic": topic,
                       "key_field": key_field},
    )  # fmt: skip
    payloads = [
        '{"group_id": "a", "tg_name": "t"}',
        '{"group_id": 5}',
        '{"group_id": 1.50}',
        '{"group_id": 1e309}',
        '{"group_id": {"x": [1, 2.0], "y": "z"}}',
        '{"group_id": true}',
        '{"group_id": null, "tg_name": "fallback"}',
        '{"group_id": "\\u00fc \\"q\\" \\\\ \\n tab\\t"}',
        '{"tg_name": "only"}',
        '{"tg_name": 3}',
        '{"meta": {"group": "nested"}, "tg_name": "t"}',
        '{"meta": {"group": 12}}',
        '{"meta": "not an object", "tg_name": "t"}',
        '{"items": ["first", "second"], "tg_name": "t"}',
        '{"items": {"0": "zero"}}',
        "[1, 2]",
        '"a string"',
        "7",
    ]
    metadata = [None, '{"topic": "orders", "priority": {"level": 1}, "n": 2.5}', '{"s": "v"}',
                '["not", "an", "object"]']  # fmt: skip
    try:
        events = build(h.settings).events
        assert isinstance(events, SubscriptionStream)
        for i, payload in enumerate(payloads):
            h.sql(
                "INSERT INTO _walcast.events (payload, metadata, stream_id)"
                " VALUES (%s::jsonb, %s::jsonb, %s)",
                [payload, metadata[i % len(metadata)], stream],
            )
        h.sql(
            "INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
            " SELECT %s, created_at, id FROM _walcast.events WHERE stream_id = %s ORDER BY id",
            [stream, stream],
        )
        rows = h.sql(
            "SELECT id, payload::text, metadata::text, stream_id, created_at::text"
            " FROM _walcast.events WHERE stream_id = %s ORDER BY id",
            [stream],
        )
        expected = {}
        for eid, payload, meta, sid, created in rows:
            row = {"id": eid, "payload": payload, "metadata": meta, "stream_id": sid,
                   "created_at": created}  # fmt: skip
            out = event_records.event_message(topic, row, key_field, None)
            assert out is not None
            expected[str(eid).encode()] = (out.key, out.value, out.headers)
        events.set_checkpoint("a test outage")
        assert replay.replay_queue(
            h.settings, events.target, events.metrics, threading.Event(), lambda: None
        )
        got = {}
        consumer = Consumer(
            {
                "bootstrap.servers": h.settings.kafka.bootstrap_servers,
                "group.id": f"{unique_name}-replay",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        try:
            while len(got) < len(expected) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                headers = msg.headers() or []
                eid = dict(headers)["walcast-event-id"]
                got[eid] = (msg.key(), msg.value(), headers)
        finally:
            consumer.close()
        assert set(got) == set(expected), f"received {len(got)} of {len(expected)} events"
        for eid, want in expected.items():
            assert got[eid] == want, f"event {eid!r}: replay sent {got[eid]}, live sends {want}"
    finally:
        _forget_stream(h, stream, topic)


def _forget_stream(h: Harness, stream: int, topic: str) -> None:
    """A test's stream gone: its queue, events and row, the walcast objects, the topic."""
    h.sql("DELETE FROM _walcast.replay_queue WHERE stream_id = %s", [stream])
    h.sql("DELETE FROM _walcast.events WHERE stream_id = %s", [stream])
    h.sql("DELETE FROM _walcast.streams WHERE id = %s", [stream])
    admin.tear_down(h.settings)
    client = AdminClient(h.settings.kafka.client_config())
    if topic in client.list_topics(timeout=10).topics:
        client.delete_topics([topic])[topic].result(30)
