"""The shared consumer loop with a fake sink (implementing the BatchSink protocol) and a
fake consumer: commits only after the write that covers them, in hand-over order; a
control event is a barrier; poison and refused records become dead letters; a
rebalance in the middle of a flush drops nothing the member keeps."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from shared.consumer import ConsumerLoop, ConsumerMetrics, DeadLetters, LoopLink
from shared.contract.event import EventView
from shared.errors import PermanentError, RetriableError
from shared.interfaces import Origin, Wait
from shared.kafka import KafkaOffsetCheckpointer
from shared.retry import BackoffPolicy
from shared.settings import BatchSettings, ConsumerSettings, KafkaSettings

TOPIC = "walcast.cdc"


@dataclass
class ListBatch:
    """A batch that keeps every event's (partition, offset, id)."""

    items: list[tuple[int, int, Any]] = field(default_factory=list)
    records: int = 0
    bytes: int = 0

    def __len__(self) -> int:
        return len(self.items)

    def clear(self) -> None:
        self.items.clear()
        self.records = self.bytes = 0


class RecordingSink:
    """Writes batches to a list, refuses ids it is told to, logs every call in order."""

    def __init__(self, wait: Wait, refuse: frozenset[Any] = frozenset()) -> None:
        self.wait = wait
        self.refuse = refuse
        self.log: list[tuple[str, Any]] = []
        self.release = threading.Event()
        self.release.set()

    def new_batch(self) -> ListBatch:
        return ListBatch()

    def add(self, batch: ListBatch, event: EventView, origin: Origin) -> str | None:
        batch.records += 1
        batch.bytes += len(origin.value)
        if event.key["id"] == "no-id":
            return "cannot address this row"
        batch.items.append((origin.partition, origin.offset, event.key["id"]))
        return None

    def write(
        self, batch: ListBatch, sleep: Wait, before: tuple[Future[Any], ...]
    ) -> list[tuple[Origin, str]]:
        self.release.wait(10)
        self.log.append(("write", [i for _, _, i in batch.items]))
        return []

    def control(self, event: EventView) -> None:
        self.log.append(("control", event.op))


class FakeConsumer(Consumer):  # type: ignore[misc]
    """Serves a script of records once, owns partitions 0 and 1, records commits; its
    first ``poll`` (a flush waiting for a write) may serve a revocation of partition 1."""

    def __init__(self, loop: ConsumerLoop[ListBatch] | None = None) -> None:
        self.loop = loop
        self.owned = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
        self.commits: list[dict[tuple[str, int], int]] = []
        self.revoke_on_poll: threading.Event | None = None
        self.paused = set()

    def assignment(self) -> list[TopicPartition]:
        return list(self.owned)

    # As librdkafka: a partition's pause is kept until resumed, across losing and
    # regaining the partition.
    paused: set[int]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in partitions}

    def poll(self, timeout: float | None = None) -> None:
        if self.revoke_on_poll is not None and not self.revoke_on_poll.is_set():
            revoked = [self.owned.pop()]
            assert self.loop is not None
            self.loop._on_revoke(self, revoked)
            self.revoke_on_poll.set()

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        self.commits.append({(t.topic, t.partition): t.offset for t in offsets})
        return None if asynchronous else offsets


class ListDeadLetters(DeadLetters):
    def __init__(self) -> None:
        self.sent: list[tuple[int, str, str]] = []

    def send(self, origin: Origin, reason: str, kind: str) -> None:
        self.sent.append((origin.offset, kind, reason))

    def flush(self, timeout_s: float) -> None:
        pass

    def close(self) -> None:
        pass


class Msg:
    """The parts of a confluent_kafka Message the loop reads."""

    def __init__(
        self,
        partition: int,
        offset: int,
        value: bytes | None,
        key: bytes | None = None,
        age_s: float = 0.0,
    ) -> None:
        self._p, self._o, self._v, self._k = partition, offset, value, key
        self._ms = int((time.time() - age_s) * 1000)

    def timestamp(self) -> tuple[int, int]:
        return 1, self._ms  # TIMESTAMP_CREATE_TIME

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v


def event(op: str = "insert", doc_id: Any = 1, lsn: int = 100) -> bytes:
    ev: dict[str, Any] = {"v": 1, "op": op, "db": "app", "schema": "public", "table": "t",
                          "lsn": lsn, "key": {"id": doc_id}, "new": {"id": doc_id}}  # fmt: skip
    if op == "ddl":
        ev |= {"key": {}, "new": None, "ddl": {"tag": "ALTER TABLE", "columns": []}}
    return orjson.dumps(ev)


def make_loop(
    concurrency: int = 1, refuse: frozenset[Any] = frozenset(), input_format: str = "walcast"
) -> tuple[ConsumerLoop[ListBatch], RecordingSink, FakeConsumer, ListDeadLetters]:
    stop = threading.Event()
    link = LoopLink(stop)
    sink = RecordingSink(link.wait, refuse)
    dead = ListDeadLetters()
    loop = ConsumerLoop[ListBatch](
        name="test loop",
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        consumer=ConsumerSettings.model_validate({"input_format": input_format}),
        batch=BatchSettings(concurrency=concurrency),
        retry=BackoffPolicy(),
        metrics=ConsumerMetrics(CollectorRegistry(), "test"),
        sink=sink,
        link=link,
        stop_event=stop,
        dead_letters=dead,
    )
    consumer = FakeConsumer(loop)
    loop.consumer = consumer
    loop.checkpointer = KafkaOffsetCheckpointer(consumer)
    loop.writer = ThreadPoolExecutor(concurrency)
    return loop, sink, consumer, dead


def committed(consumer: FakeConsumer) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for commit in consumer.commits:
        out.update(commit)
    return out


def test_the_consumer_refetches_soon_once_its_prefetch_budget_drains() -> None:
    """librdkafka's own 1 s wait before fetching again held a fast consumer to about one
    prefetch budget per second (docs/benchmarks.md): the loop asks for the setting's wait,
    under a name this librdkafka knows (an unknown property fails the constructor)."""
    loop, *_ = make_loop()
    config = loop.consumer_config()
    assert config["fetch.queue.backoff.ms"] == ConsumerSettings().fetch_backoff_ms == 10
    assert config["queued.max.messages.kbytes"] == ConsumerSettings().max_queue_bytes // 1024
    Consumer(config).close()


def test_offsets_move_only_after_the_write_that_covers_them() -> None:
    loop, sink, consumer, _ = make_loop(concurrency=2)
    sink.release.clear()  # the sink is slow
    try:
        loop.handle(Msg(0, 5, event(doc_id=1)))
        loop.flush(drain=False)
        assert consumer.commits == []  # handed over, not written: nothing committed
        sink.release.set()
        loop.flush(drain=True)
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    assert sink.log == [("write", [1])]
    assert committed(consumer) == {(TOPIC, 0): 6}


def test_record_age_is_observed_once_per_batch_after_its_write() -> None:
    """Kafka → sink latency: the age of the batch's first record when its write
    succeeded, observed when the offsets move, not when the batch is handed over."""
    loop, sink, _, _ = make_loop()
    registry = CollectorRegistry()
    loop.metrics = ConsumerMetrics(registry, "test")
    sink.release.clear()
    try:
        loop.handle(Msg(0, 1, event(doc_id=1), age_s=30))
        loop.handle(Msg(0, 2, event(doc_id=2), age_s=1))
        loop.flush(drain=False)
        assert registry.get_sample_value("test_record_age_seconds_count") == 0
        sink.release.set()
        loop.flush(drain=True)
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    assert registry.get_sample_value("test_record_age_seconds_count") == 1
    assert 30 <= (registry.get_sample_value("test_record_age_seconds_sum") or 0) < 60


def test_a_control_event_is_a_barrier() -> None:
    loop, sink, consumer, _ = make_loop()
    try:
        loop.handle(Msg(0, 1, event(doc_id=1)))
        loop.handle(Msg(0, 2, event("ddl", lsn=101)))
        loop.handle(Msg(0, 3, event(doc_id=2, lsn=102)))
        loop.flush(drain=True)
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    # The data before the DDL was written (and committed) before it was applied.
    assert sink.log == [("write", [1]), ("control", "ddl"), ("write", [2])]
    assert consumer.commits[0] == {(TOPIC, 0): 2}
    assert committed(consumer) == {(TOPIC, 0): 4}


def test_poison_and_refused_records_become_dead_letters_and_are_committed() -> None:
    loop, sink, consumer, dead = make_loop()
    try:
        loop.handle(Msg(0, 1, b"not json"))
        loop.handle(Msg(0, 2, event(doc_id="no-id")))
        loop.handle(Msg(0, 3, event("heartbeat")))
        loop.flush(drain=True)
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    assert [ids for _, ids in sink.log] in ([], [[]])  # nothing written
    assert [(o, k) for o, k, _ in dead.sent] == [(1, "poison"), (2, "rejected"), (3, "poison")]
    assert "unknown op" in dead.sent[2][2]
    assert committed(consumer) == {(TOPIC, 0): 4}  # dead letters do not block the stream


def debezium_record(op: str, doc_id: int, lsn: int) -> tuple[bytes, bytes]:
    row = {"type": "struct", "optional": True,
           "fields": [{"type": "int32", "optional": False, "field": "id"}]}  # fmt: skip
    image = {"id": doc_id}
    value = {
        "schema": {"type": "struct", "fields": [{**row, "field": "before"},
                                                {**row, "field": "after"}]},
        "payload": {"before": image if op == "d" else None, "after": None if op == "d" else image,
                    "op": op, "source": {"db": "app", "schema": "public", "table": "t",
                                         "lsn": lsn, "txId": 1, "ts_ms": 0}},
    }  # fmt: skip
    return orjson.dumps({"schema": {}, "payload": image}), orjson.dumps(value)


@pytest.mark.parametrize("input_format", ["debezium", "auto"])
def test_debezium_records_are_read_as_events(input_format: str) -> None:
    """A Debezium topic: changes become the sink's events, a tombstone is committed and
    nothing else, a record without its schema is a dead letter saying so; under ``auto``
    walcast's own events still pass as they are."""
    loop, sink, consumer, dead = make_loop(input_format=input_format)
    try:
        key, value = debezium_record("c", 7, 100)
        loop.handle(Msg(0, 1, value, key))
        key, value = debezium_record("d", 7, 101)
        loop.handle(Msg(0, 2, value, key))
        loop.handle(Msg(0, 3, None, key))  # its tombstone
        schemaless = orjson.dumps(orjson.loads(debezium_record("c", 8, 102)[1])["payload"])
        loop.handle(Msg(0, 4, schemaless))
        if input_format == "auto":
            loop.handle(Msg(0, 5, event(doc_id=9, lsn=103)))
        loop.flush(drain=True)
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    written = [i for _, ids in sink.log for i in ids]
    assert written == ([7, 7, 9] if input_format == "auto" else [7, 7])
    assert [(o, k) for o, k, _ in dead.sent] == [(4, "poison")]
    assert "without its schema" in dead.sent[0][2]
    assert committed(consumer) == {(TOPIC, 0): 6 if input_format == "auto" else 5}


def test_a_revocation_served_while_a_flush_waits_keeps_the_batch_in_hand() -> None:
    loop, sink, consumer, _ = make_loop()
    sink.release.clear()
    consumer.revoke_on_poll = sink.release  # the revocation lets the slow write finish
    try:
        loop.handle(Msg(0, 5, event(doc_id=1)))
        loop.flush(drain=False)  # in flight, slow
        loop.handle(Msg(0, 6, event(doc_id=2)))
        loop.handle(Msg(1, 3, event(doc_id=3)))
        loop.flush(drain=False)  # waits for the first write; partition 1 is revoked
        loop.flush(drain=True)
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    assert sink.log == [("write", [1]), ("write", [2, 3])]  # written, not dropped
    assert committed(consumer)[(TOPIC, 0)] == 7  # past offset 6 only because it was written


class FailingSink(RecordingSink):
    def write(
        self, batch: ListBatch, sleep: Wait, before: tuple[Future[Any], ...]
    ) -> list[tuple[Origin, str]]:
        if self.refuse & {i for _, _, i in batch.items}:
            raise RuntimeError("the engine is down")
        return super().write(batch, sleep, before)


def test_a_failed_flush_on_revocation_never_lets_a_commit_pass_unwritten_records() -> None:
    """Reproduced before: the flush on revocation failed, was logged and swallowed, the
    member kept partition 0 (cooperative-sticky) and a later commit moved it to 13 while
    offsets 10 and 11 were never written."""
    loop, _sink, consumer, _ = make_loop()
    failing = FailingSink(loop.wait, refuse=frozenset({10}))
    loop.sink = failing
    try:
        loop.handle(Msg(0, 10, event(doc_id=10)))
        loop.handle(Msg(0, 11, event(doc_id=11)))
        revoked = [consumer.owned.pop()]  # partition 1 goes; 0 stays with this member
        loop._on_revoke(consumer, revoked)
        loop.handle(Msg(0, 12, event(doc_id=12)))
        # the session restarts from the committed offsets
        with pytest.raises(RetriableError, match="revocation"):
            loop.flush(drain=True)
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    assert committed(consumer).get((TOPIC, 0), 0) <= 10
    assert ("write", [12]) not in failing.log


def test_ready_means_joined_the_group() -> None:
    """kafka2search said /ready 2 s after a restart and got its partitions ~30 s later:
    ready now waits for the assignment (possibly empty: more members than partitions)."""
    loop, _sink, consumer, _ = make_loop()
    try:
        assert not loop.joined
        loop._on_assign(consumer, [])
        assert loop.joined
        loop._on_lost(consumer, consumer.assignment())
        assert not loop.joined
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)


def test_an_avro_record_without_a_registry_stops_the_loop_saying_what_to_set() -> None:
    """A whole Avro topic read without schema_registry.url must not pour into the
    dead-letter topic: the loop stops (nothing committed) with what to fix."""
    loop, _, consumer, dead = make_loop()
    try:
        with pytest.raises(PermanentError, match="no schema registry is configured"):
            loop.handle(Msg(0, 1, b"\x00\x00\x00\x00\x01payload"))
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
    assert (dead.sent, consumer.commits) == ([], [])


@pytest.mark.parametrize("how", ["lost", "revoked"])
def test_partitions_paused_by_a_slow_write_are_fetched_again_when_they_come_back(
    how: str,
) -> None:
    """A slow write paused the partitions; the session then expired (Kafka restarted) or
    they were revoked, and the group gave them back to this member. librdkafka keeps a
    pause across that: unless the loop lifts it, nothing is ever fetched again, without
    an error (seen once in the composition suite: kafka2search stalled for good)."""
    loop, _, consumer, _ = make_loop()
    try:
        loop._pause()  # a write slower than a second (_await) or a backoff (wait)
        assert consumer.paused == {0, 1}
        parts = list(consumer.owned)
        if how == "lost":
            loop._on_lost(consumer, parts)
        else:
            loop._on_revoke(consumer, parts)
        consumer.owned = []
        loop.resume()  # a later flush finds nothing assigned
        consumer.owned = parts
        loop._on_assign(consumer, parts)
        assert consumer.paused == set(), "the partitions came back paused: never fetched"
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)


def test_partitions_assigned_during_a_backoff_stay_paused_until_it_ends() -> None:
    loop, _, consumer, _ = make_loop()
    try:
        loop._pause()
        new = [TopicPartition(TOPIC, 2)]
        consumer.owned.append(new[0])
        loop._on_assign(consumer, new)
        assert consumer.paused == {0, 1, 2}
        loop.resume()
        assert consumer.paused == set()
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)


def test_rebalance_callbacks_of_a_consumer_not_the_sessions_are_ignored() -> None:
    """A closing consumer (the session over, maybe on a background thread) serves a
    revocation: it must not flush or clear the next session's state."""
    loop, sink, consumer, _ = make_loop()
    on_revoke = loop._session_only(loop._on_revoke)
    try:
        loop.handle(Msg(0, 1, event(doc_id=1)))
        on_revoke(FakeConsumer(loop), [TopicPartition(TOPIC, 0)])  # another consumer
        assert len(loop.batch) == 1  # the session's batch untouched, nothing written
        assert sink.log == []
        assert consumer.commits == []
        on_revoke(consumer, [TopicPartition(TOPIC, 0)])  # the session's own: flushed
        assert sink.log == [("write", [1])]
        assert committed(consumer) == {(TOPIC, 0): 2}
    finally:
        assert loop.writer is not None
        loop.writer.shutdown(wait=True)
