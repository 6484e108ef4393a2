"""Issue 36, finding 4, against real Kafka and real HTTP receivers
(tests/webhook_receiver.py): a hostile receiver (a ``Retry-After`` in the year
99999999999, an answer trickled a byte at a time, two Content-Length values) fails only
its own attempts, which are retried and then delivered or dead-lettered, while the other
endpoints deliver on; a stop is honoured within the attempt's deadline and commits
nothing undelivered; a record whose id headers no header can carry is dead-lettered; one
endpoint's unexpected failure stops the whole service loudly, never silently, and never
leaves it hanging."""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from services.kafka2webhook.app import build
from tests.integration.kafka2webhook.test_webhooks import World, event, world  # noqa: F401

FAST = {"initial_backoff_s": 0.2, "max_backoff_s": 0.5, "jitter": 0.0}


def webhook_ids(received: list[Any]) -> set[str]:
    return {r.headers["webhook-id"] for r in received}


def committed(w: World, group: str) -> list[int]:
    c = Consumer({"bootstrap.servers": w.bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(w.topic, p) for p in range(3)]
        return [tp.offset for tp in c.committed(parts, timeout=10)]
    finally:
        c.close()


def test_hostile_receivers_fail_only_their_own_deliveries(world: World) -> None:  # noqa: F811
    healthy = world.receiver()
    hostile = world.receiver(
        hostile={"/hook": ["huge-retry-after", "trickle-body", "trickle-headers", "two-lengths"]}
    )
    doomed = world.receiver(hostile={"/hook": ["trickle-body"]})  # never answers whole
    settings = world.settings(
        [
            {"name": "healthy", "url": healthy.url()},
            {"name": "hostile", "url": hostile.url()},
            {"name": "doomed", "url": doomed.url(), "tables": ["public.doomed"]},
        ],
        delivery={**FAST, "timeout_s": 1, "give_up_after_s": 8, "parallel_keys": 2},
    )
    records = [(f"k{i % 4}".encode(), event("t", "insert", 100 + i, i % 4)) for i in range(20)]
    records.append((b"d", event("doomed", "insert", 500, 1)))
    world.produce(records)
    began = time.monotonic()
    service = world.start(settings)

    healthy.wait_for(lambda: len(healthy.delivered()) >= 21, "the healthy endpoint's events")
    assert time.monotonic() - began < 30, "the healthy endpoint waited for the hostile ones"
    hostile.wait_for(lambda: len(webhook_ids(hostile.delivered())) >= 21, "the hostile one's")
    # The hostile receiver got each of its four answers once, each attempt retried.
    assert sum(1 for r in hostile.received if r.status == 0) == 4
    for receiver in (healthy, hostile):
        got = [r.json for r in receiver.delivered()]
        assert {e["lsn"] for e in got} == {100 + i for i in range(20)} | {500}
        for key in range(4):  # per key, in order (first deliveries)
            lsns = [e["lsn"] for e in got if e["table"] == "t" and e["key"]["id"] == key]
            assert lsns == sorted(lsns), (key, lsns)

    letters = world.dead_letters(1, timeout=60)  # the doomed event, after its budget
    assert len(letters) == 1
    headers = dict(letters[0].headers())
    assert headers["walcast-endpoint"] == b"doomed"
    assert b"within" in headers["walcast-error"], headers["walcast-error"]
    assert orjson.loads(letters[0].value())["lsn"] == 500
    assert len(doomed.received) >= 2  # retried before it was given up on
    thread = world.threads[0][1]
    assert thread.is_alive()  # the service runs on: no endpoint took it down
    assert service.status()["doomed"]["dead_lettered"] == 1


def test_stop_is_honoured_within_the_deadline_and_commits_nothing_undelivered(
    world: World,  # noqa: F811
) -> None:
    slow = world.receiver(hostile={"/hook": ["trickle-body"]})
    timeout_s = 3.0
    settings = world.settings(
        [{"name": "slow", "url": slow.url()}],
        delivery={**FAST, "timeout_s": timeout_s, "give_up_after_s": 600, "parallel_keys": 1},
    )
    world.produce([(b"k", event("t", "insert", 100 + i, 1)) for i in range(5)])
    service = build(settings)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    slow.wait_for(lambda: len(slow.received) >= 1, "an answer being trickled")
    stopped = time.monotonic()
    service.stop()
    thread.join(timeout_s + 20)
    assert not thread.is_alive(), "the stop waited on the trickling receiver"
    # The attempt in flight ends at its deadline; closing the consumer takes the rest.
    assert time.monotonic() - stopped < timeout_s + 10
    assert not errors, errors
    assert all(o < 0 for o in committed(world, f"{world.name}-group.slow"))  # none

    good = world.receiver()  # the receiver is fixed: everything arrives, nothing lost
    fixed = world.settings([{"name": "slow", "url": good.url()}], delivery=FAST)
    world.start(fixed)
    good.wait_for(lambda: len(good.delivered()) >= 5, "the events after the restart")
    assert [r.json["lsn"] for r in good.delivered()] == [100 + i for i in range(5)]
    assert webhook_ids(slow.received) <= webhook_ids(good.delivered())  # the same ids


def test_subscription_events_with_ids_no_header_can_carry_are_dead_lettered(
    world: World,  # noqa: F811
) -> None:
    r = world.receiver()
    settings = world.settings([{"name": "subs", "url": r.url(), "input": "events"}])
    ids = [b"1", b"2\r\nX-Evil: 1", b"\xff\xfe", b"4"]
    world.produce(
        [(b"s", orjson.dumps({"tg_name": "s", "n": n})) for n in range(4)],
        topic=f"{world.name}.events",
        headers=[[("walcast-event-id", i), ("walcast-stream-id", b"9")] for i in ids],
    )
    world.start(settings)
    r.wait_for(lambda: len(r.delivered()) >= 2, "the well-formed events")
    letters = world.dead_letters(2)
    assert len(letters) == 2
    for m in letters:
        reason = dict(m.headers())["walcast-error"].decode()
        assert "not ids pg2kafka writes" in reason
        assert "\r" not in reason
        assert "\n" not in reason
    assert sorted(r.headers["webhook-id"] for r in r.delivered()) == ["evt_9_1", "evt_9_4"]
    assert all(x.signature_ok for x in r.received)


def test_one_endpoints_unexpected_failure_stops_the_service_loudly(
    world: World,  # noqa: F811
) -> None:
    ok, slow = world.receiver(), world.receiver(hostile={"/hook": ["trickle-body"]})
    settings = world.settings(
        [{"name": "buggy", "url": ok.url()}, {"name": "slow", "url": slow.url()}],
        delivery={**FAST, "timeout_s": 3, "give_up_after_s": 600},
    )
    service = build(settings)
    buggy = next(e for e in service.endpoints if e.settings.name == "buggy")

    def bug(_item: Any) -> tuple[float | None, str | None]:
        # Fails while the other endpoint's receiver is trickling its answer.
        slow.wait_for(lambda: len(slow.received) >= 1, "the slow endpoint's attempt")
        raise RuntimeError("a bug in one endpoint's delivery")

    buggy.deliverer._attempt = bug  # type: ignore[method-assign, assignment]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    world.produce([(b"k", event("t", "insert", 100, 1))])
    thread.join(60)
    # Not running-but-dead: every endpoint stopped (the slow one within its deadline),
    # and run raised the failure (the command exits non-zero with it).
    assert not thread.is_alive(), "the service hangs after one endpoint failed"
    assert len(errors) == 1
    assert "a bug in one endpoint's delivery" in str(errors[0])
