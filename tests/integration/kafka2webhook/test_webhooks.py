"""kafka2webhook against real Kafka and a real HTTP receiver in the test process
(tests/webhook_receiver.py, which verifies every signature as receivers do): filters and
signatures, retries in order, an endpoint down for 60 s beside a healthy one, permanent
refusals to the dead-letter topic, and kill -9 mid-delivery."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from services.kafka2webhook import admin
from services.kafka2webhook.app import Service, build
from services.kafka2webhook.settings import Kafka2WebhookSettings
from shared.errors import ConfigError
from shared.settings import load_settings
from tests.webhook_receiver import Receiver

REPO = Path(__file__).resolve().parents[3]
SECRET = "test-signing-secret-0123456789"


def event(table: str, op: str, lsn: int, row_id: int, **new: Any) -> bytes:
    """A change event as pg2kafka writes it (the row ``{"id", "v": lsn, **new}``)."""
    return orjson.dumps({
        "v": 1, "op": op, "db": "walcast", "schema": "public", "table": table, "lsn": lsn,
        "seq": 0, "commit_lsn": lsn, "xid": 1, "commit_ts": "2026-01-01T00:00:00.000000Z",
        "key": {"id": row_id}, "new": {"id": row_id, "v": lsn, **new}, "old": None,
        "types": {"id": "int4", "v": "int4"},
    })  # fmt: skip


@dataclass
class World:
    name: str
    bootstrap: str
    env_file: Path
    topic: str
    dlq: str
    receivers: list[Receiver] = field(default_factory=list)
    threads: list[tuple[Service, threading.Thread, list[BaseException]]] = field(
        default_factory=list
    )

    def produce(self, records: list[tuple[bytes, bytes]], topic: str | None = None,
                headers: list[list[tuple[str, bytes]]] | None = None) -> None:  # fmt: skip
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        for i, (key, value) in enumerate(records):
            p.produce(topic or self.topic, value, key, headers=headers[i] if headers else None)
        assert p.flush(30) == 0

    def receiver(self, **kw: Any) -> Receiver:
        r = Receiver(SECRET.encode(), **kw).start()
        self.receivers.append(r)
        return r

    def settings(self, endpoints: list[dict[str, Any]], **sections: Any) -> Kafka2WebhookSettings:
        overrides: dict[str, Any] = {
            "consumer": {"topics": [self.topic], "group_id": f"{self.name}-group",
                         "dlq_topic": self.dlq},
            "events_topic": f"{self.name}.events",
            "endpoints": [{"secret": SECRET, **e} for e in endpoints],
            "delivery": {"initial_backoff_s": 0.2, "max_backoff_s": 2, "parallel_keys": 4},
            "http": {"enabled": True, "port": 0},
            "log": {"format": "text"},
            "retry": {"give_up_after_s": 60},
        }  # fmt: skip
        for key, value in sections.items():
            overrides[key] = {**overrides.get(key, {}), **value}
        return load_settings(Kafka2WebhookSettings, env_file=self.env_file, **overrides)

    def start(self, settings: Kafka2WebhookSettings) -> Service:
        service = build(settings)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                service.run()
            except BaseException as exc:  # noqa: BLE001 - surfaced at teardown
                errors.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append((service, t, errors))
        return service

    def dead_letters(self, expect: int, timeout: float = 60) -> list[Any]:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"{self.name}-dlq-read",
                      "auto.offset.reset": "earliest"})  # fmt: skip
        c.subscribe([self.dlq])
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        try:
            while len(got) < expect and time.monotonic() < deadline:
                for m in c.consume(100, 0.5):
                    if m.error() is None:
                        got.append(m)
        finally:
            c.close()
        return got


@pytest.fixture
def world(stack_env: dict[str, str], unique_name: str) -> Iterator[World]:
    bootstrap = stack_env["WALCAST_KAFKA_BOOTSTRAP"]
    w = World(unique_name, bootstrap, Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env",
              f"{unique_name}.cdc", f"{unique_name}.dlq")  # fmt: skip
    client = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(w.topic, 3, 1), NewTopic(f"{unique_name}.events", 2, 1)]
    for fut in client.create_topics(topics).values():
        fut.result(30)
    yield w
    for service, thread, errors in w.threads:
        service.stop()
        thread.join(60)
        assert not thread.is_alive(), "kafka2webhook did not stop within 60 s"
        assert not errors, errors
    for r in w.receivers:
        r.stop()
    present = client.list_topics(timeout=10).topics
    gone = [t for t in (w.topic, w.dlq, f"{unique_name}.events") if t in present]
    for fut in client.delete_topics(gone).values():
        fut.result(30)


def ids(received: list[Any]) -> list[str]:
    return [r.headers["webhook-id"] for r in received]


def test_signed_filtered_deliveries_in_key_order_and_status(world: World) -> None:
    orders, batched, events = world.receiver(), world.receiver(), world.receiver()
    settings = world.settings([
        {"name": "orders", "url": orders.url(), "tables": ["public.orders"],
         "operations": ["insert", "update"],
         "filter": [{"field": "new.status", "one_of": ["paid", "shipped"]}]},
        {"name": "batched", "url": batched.url(), "batch_size": 5},
        {"name": "subs", "url": events.url(), "input": "events", "subscriptions": ["order-*"]},
    ])  # fmt: skip
    records = []
    for i in range(60):  # 10 rows, 6 changes each, statuses cycling
        row = i % 10
        status = ["new", "paid", "shipped"][i % 3]
        records.append((f"public.orders.{row}".encode(),
                        event("orders", "insert" if i < 10 else "update", 1000 + i, row,
                              status=status)))  # fmt: skip
    records.append((b"public.other", event("other", "insert", 5000, 1, status="paid")))
    world.produce(records)
    subscription = [
        (b"order-paid", orjson.dumps({"tg_name": "order-paid", "tg_op": "INSERT", "n": n}))
        for n in range(3)
    ] + [(b"user-new", orjson.dumps({"tg_name": "user-new", "tg_op": "INSERT"}))]
    world.produce(subscription, topic=f"{world.name}.events",
                  headers=[[("walcast-event-id", str(100 + n).encode()),
                            ("walcast-stream-id", b"1")] for n in range(4)])  # fmt: skip
    service = world.start(settings)

    wanted = [orjson.loads(v) for _, v in records
              if orjson.loads(v)["table"] == "orders"
              and orjson.loads(v)["new"]["status"] in ("paid", "shipped")]  # fmt: skip
    orders.wait_for(lambda: len(orders.delivered()) >= len(wanted), "the filtered events")
    batched.wait_for(lambda: sum(len(r.json) for r in batched.delivered()) >= 61, "batches")
    elements = [e for r in batched.delivered() for e in r.json]
    assert {e["webhook_id"] for e in elements} == {
        "wc_" + hashlib.sha256(v).hexdigest()[:40] for _, v in records
    }
    events.wait_for(lambda: len(events.delivered()) >= 3, "subscription events")
    got = [r.json for r in orders.delivered()]
    assert all(r.signature_ok for r in orders.received + batched.received + events.received)
    assert sorted(e["lsn"] for e in got) == sorted(e["lsn"] for e in wanted)
    for row in range(10):  # each key's events in commit order
        lsns = [e["lsn"] for e in got if e["key"]["id"] == row]
        assert lsns == sorted(lsns), (row, lsns)
    assert len(set(ids(orders.delivered()))) == len(wanted)  # one id per event
    sizes = [len(r.json) for r in batched.delivered()]
    assert max(sizes) <= 5
    assert sum(sizes) == 61
    assert sorted(ids(events.delivered())) == ["evt_1_100", "evt_1_101", "evt_1_102"]
    assert events.delivered()[0].json["tg_name"] == "order-paid"

    assert service.runner.ops is not None
    url = f"http://127.0.0.1:{service.runner.ops.port}/status"

    def settled() -> bool:
        info = {e["endpoint"]: e for e in admin.status(settings, url)["endpoints"]}
        return info["orders"]["lag"] == 0 and info["batched"]["lag"] == 0

    orders.wait_for(settled, "offsets committed after delivery")
    info = {e["endpoint"]: e for e in admin.status(settings, url)["endpoints"]}
    assert info["orders"]["delivered"] == len(wanted)
    assert info["batched"]["delivered"] == 61
    assert info["subs"]["delivered"] == 3
    assert info["orders"]["failing"] is False
    assert info["orders"]["dead_letters"]["count"] == 0


def test_a_500_then_200_gets_each_event_once_in_order(world: World) -> None:
    r = world.receiver(script={"/hook": [(500, None), (503, "1"), (500, None)]})
    settings = world.settings([{"name": "flaky", "url": r.url()}])
    world.produce([(b"k", event("t", "insert", 100 + i, 7)) for i in range(10)])
    world.start(settings)
    r.wait_for(lambda: len(r.delivered()) >= 10, "all ten events")
    time.sleep(1)  # nothing more arrives
    lsns = [x.json["lsn"] for x in r.delivered()]
    assert lsns == [100 + i for i in range(10)]  # each once, in order
    refused = [x for x in r.received if x.status >= 500]
    assert len(refused) == 3
    assert {x.headers["webhook-id"] for x in refused} == {r.delivered()[0].headers["webhook-id"]}
    # Retry-After: 1 was honoured between the second and the third attempt.
    assert refused[2].at - refused[1].at >= 0.9


def test_an_endpoint_down_60s_loses_nothing_holds_memory_and_blocks_no_other(
    world: World,
) -> None:
    down, healthy = world.receiver(), world.receiver()
    settings = world.settings(
        [{"name": "down", "url": down.url()}, {"name": "healthy", "url": healthy.url()}],
        batch={"max_docs": 50},
        delivery={"initial_backoff_s": 0.5, "max_backoff_s": 5, "give_up_after_s": 600,
                  "parallel_keys": 4},
    )  # fmt: skip
    service = world.start(settings)
    world.produce([(str(i).encode(), event("t", "insert", 10 + i, i)) for i in range(20)])
    down.wait_for(lambda: len(down.delivered()) >= 20, "the first events")
    down.stop()
    went_down = time.monotonic()
    total = 20 + 500  # ten times a batch while it is down
    world.produce([(str(i).encode(), event("t", "insert", 10 + i, i % 40))
                   for i in range(20, total)])  # fmt: skip
    healthy.wait_for(lambda: len(healthy.delivered()) >= total, "the healthy endpoint")
    assert time.monotonic() - went_down < 60, "the healthy endpoint waited for the dead one"
    down_loop = next(e.loop for e in service.endpoints if e.settings.name == "down")

    def consumed() -> float:
        value = service.registry.get_sample_value(
            "walcast_kafka2webhook_records_total", {"webhook": "down"}
        )
        assert value is not None
        return value

    time.sleep(max(0.0, 10 - (time.monotonic() - went_down)))
    paused_at = consumed()
    while time.monotonic() - went_down < 60:
        # One batch in flight (retrying) and at most one in hand: never more read.
        assert down_loop.batch.records <= 50
        assert len(down_loop.inflight) <= 1
        time.sleep(1)
    # Paused: nothing more was read while the receiver was away.
    assert consumed() == paused_at, (paused_at, consumed())
    assert paused_at - 20 <= 2 * 50, paused_at
    down.start()
    down.wait_for(lambda: len({x.headers["webhook-id"] for x in down.delivered()}) >= total,
                  "everything after the receiver came back", timeout=120)  # fmt: skip
    assert {x.json["lsn"] for x in down.delivered()} == {10 + i for i in range(total)}
    assert world.dead_letters(1, timeout=2) == []


def test_410_and_permanent_4xx_go_to_the_dead_letter_topic(world: World) -> None:
    r = world.receiver(script={"/hook": [(410, None), (400, None)]})
    settings = world.settings([{"name": "gone", "url": r.url()}],
                              delivery={"parallel_keys": 1})  # fmt: skip
    world.produce([(b"k", event("t", "insert", 100 + i, i)) for i in range(5)])
    world.start(settings)
    r.wait_for(lambda: len(r.delivered()) >= 3, "the events after the refused ones")
    letters = world.dead_letters(2)
    assert len(letters) == 2
    reasons = []
    for m in letters:
        headers = dict(m.headers())
        assert headers["walcast-endpoint"] == b"gone"
        reasons.append(headers["walcast-error"].decode())
    assert "HTTP 410" in reasons[0]
    assert "scripted" in reasons[0]  # an excerpt of the answer's body
    assert "HTTP 400" in reasons[1]
    assert [orjson.loads(m.value())["lsn"] for m in letters] == [100, 101]
    assert [x.json["lsn"] for x in r.delivered()] == [102, 103, 104]


def test_kill_9_mid_delivery_delivers_at_least_once_with_stable_ids(
    world: World, tmp_path: Path
) -> None:
    r = world.receiver(delay=lambda _p: 0.05)
    total = 300
    world.produce([(str(i % 20).encode(), event("t", "insert", 1000 + i, i % 20))
                   for i in range(total)])  # fmt: skip
    env = {
        **os.environ,
        "KAFKA2WEBHOOK_CONSUMER__TOPICS": orjson.dumps([world.topic]).decode(),
        "KAFKA2WEBHOOK_CONSUMER__GROUP_ID": f"{world.name}-group",
        "KAFKA2WEBHOOK_CONSUMER__DLQ_TOPIC": world.dlq,
        "KAFKA2WEBHOOK_ENDPOINTS": orjson.dumps([{"name": "slow", "url": r.url()}]).decode(),
        "KAFKA2WEBHOOK_SECRETS__SLOW": SECRET,
        "KAFKA2WEBHOOK_HTTP__PORT": "0",
        "KAFKA2WEBHOOK_LOG__FORMAT": "text",
    }
    cmd = [sys.executable, "-m", "services.kafka2webhook", "--env-file", str(world.env_file), "run"]

    def run(log: str) -> subprocess.Popen[bytes]:
        with (tmp_path / log).open("wb") as out:
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    first = run("first.log")
    try:
        r.wait_for(lambda: len(r.delivered()) >= 60, "deliveries before the kill", timeout=90,
                   progress=lambda: len(r.received))  # fmt: skip
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    before = len(r.delivered())
    assert before < total, "everything was delivered before the kill"
    second = run("second.log")
    try:
        r.wait_for(lambda: len({x.headers["webhook-id"] for x in r.delivered()}) >= total,
                   "every event after the restart", timeout=90,
                   progress=lambda: len(r.received))  # fmt: skip
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, (tmp_path / "second.log").read_text()[-3000:]
    by_id: dict[str, set[int]] = {}
    for x in r.delivered():
        by_id.setdefault(x.headers["webhook-id"], set()).add(x.json["lsn"])
    # At least once: every event; a redelivery carries the id of the event it repeats.
    assert {lsn for lsns in by_id.values() for lsn in lsns} == {1000 + i for i in range(total)}
    assert all(len(lsns) == 1 for lsns in by_id.values())
    for key in range(20):  # per key, first deliveries in order
        firsts: list[int] = []
        for x in r.delivered():
            lsn = x.json["lsn"]
            if x.json["key"]["id"] == key and lsn not in firsts:
                firsts.append(lsn)
        assert firsts == sorted(firsts), (key, firsts)


def test_replay_delivers_again_with_the_same_ids_and_leaves_the_offsets(world: World) -> None:
    r = world.receiver()
    settings = world.settings([{"name": "again", "url": r.url()}])
    world.produce([(str(i % 3).encode(), event("t", "insert", 100 + i, i % 3)) for i in range(9)])
    service = world.start(settings)
    r.wait_for(lambda: len(r.delivered()) >= 9, "the first deliveries")
    assert service.runner.ops is not None
    ready = urllib.request.urlopen(f"http://127.0.0.1:{service.runner.ops.port}/ready", timeout=5)
    assert ready.status == 200
    first = ids(r.delivered())
    r.wait_for(lambda: admin.status(settings)["endpoints"][0]["lag"] == 0, "the commit")
    before = {p["partition"]: p["committed"] for e in admin.status(settings)["endpoints"]
              for p in e["partitions"]}  # fmt: skip
    assert admin.replay(settings, "again", from_offset=0) == 9
    r.wait_for(lambda: len(r.delivered()) >= 18, "the replayed deliveries")
    again = ids(r.delivered())[9:]
    assert sorted(again) == sorted(first)  # the same events, the same ids
    for key in range(3):
        lsns = [x.json["lsn"] for x in r.delivered()[9:] if x.json["key"]["id"] == key]
        assert lsns == sorted(lsns)
    after = {p["partition"]: p["committed"] for e in admin.status(settings)["endpoints"]
             for p in e["partitions"]}  # fmt: skip
    assert after == before  # the endpoint's own group is untouched
    with pytest.raises(ConfigError, match="no endpoint 'nobody'"):
        admin.replay(settings, "nobody", from_offset=0)
