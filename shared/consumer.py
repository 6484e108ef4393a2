"""One Kafka consumer loop for every sink of change events.

(Over 500 lines on purpose: one class whose methods share the member's state — the batch
in hand, the writes in flight, the positions, the pause — and whose rebalance callbacks
interleave with a flush; its pieces are only correct together.)

The loop, per consumer-group member:

1. take records (``consume``); decode each with the service's
   :class:`~shared.records.RecordDecoder` (chosen once, at wiring): poison — a record
   the decoder fails on, for whatever reason, or that breaks a size limit
   (:mod:`shared.contract.limits`) — goes to the dead-letter topic with the reason, a data
   event is folded into the sink's batch (:meth:`BatchSink.add`);
2. when the batch reaches ``batch.max_docs`` / ``max_bytes`` / ``max_wait_s`` — or a
   truncate / DDL event arrives, or partitions are revoked — *flush*: hand the batch to a
   writer thread (:meth:`BatchSink.write`) while this thread goes on reading the next
   batch. Up to ``batch.concurrency`` writes run at once;
3. when the oldest write is done: send what the sink refused to the dead-letter topic,
   wait for Kafka's acknowledgement of those, and only then commit the offsets of every
   record the write covered (checkpoint last). Writes are collected strictly in the
   order they were handed over, so a commit never covers a write that has not finished.

A truncate or DDL event is a barrier: every write before it completes and is committed,
then the sink applies it (:meth:`BatchSink.control`), then it is committed itself, and
only then is the data after it read. While a write or the sink backs off, the partitions
are paused and the consumer is still polled, so the member stays in the group and nothing
more is fetched (a record fetched before the pause is held, never dropped). Memory:
``batch.concurrency`` + 1 batch budgets plus librdkafka's prefetch budget
(``consumer.max_queue_bytes``).

A failure anywhere raises out of :meth:`ConsumerLoop.run_once`; :meth:`ConsumerLoop.run`
reconnects with the configured backoff and what was not committed is read again — which
is why every sink must write idempotently (the contract's ``lsn`` is the version).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import Any, Generic, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.contract import limits
from shared.contract.event import CONTROL_OPS, EventView
from shared.errors import PermanentError, RetriableError
from shared.failpoints import failpoint
from shared.interfaces import B, BatchSink, Origin, Rejection
from shared.kafka import (
    KafkaOffsetCheckpointer,
    KafkaSink,
    Outgoing,
    close_consumer,
    ensure_topic,
)
from shared.logs import SampledLog
from shared.records import RecordDecoder, change_events
from shared.retry import BackoffPolicy, call_with_retry
from shared.settings import BatchSettings, ConsumerSettings, KafkaSettings

log = logging.getLogger(__name__)


class _Labelled(Protocol):
    def labels(self, *values: str) -> Any: ...


class _Member:
    """A labelled metric with its first label (the member's) already given."""

    def __init__(self, metric: Any, value: str) -> None:
        self.metric = metric
        self.value = value

    def labels(self, *values: str) -> Any:
        return self.metric.labels(self.value, *values)


class ConsumerMetrics:
    """The loop's own metrics, under the service's prefix. A service running several
    loops side by side (one per webhook endpoint) gives ``member_label`` and hands each
    loop its :meth:`member` view."""

    records: Any  # a Counter (or its child)
    record_age: Any  # a Histogram (or its child)
    dlq: _Labelled
    lag: _Labelled

    def __init__(
        self, registry: CollectorRegistry, prefix: str, member_label: str | None = None
    ) -> None:
        first = [member_label] if member_label else []
        self.records = Counter(
            f"{prefix}_records", "Kafka records consumed", first, registry=registry
        )
        self.dlq = Counter(
            f"{prefix}_dead_letters",
            "records sent to the dead-letter topic, by reason: poison (not an event) or"
            " rejected (the sink refused it)",
            [*first, "reason"],
            registry=registry,
        )  # fmt: skip
        self.lag = Gauge(
            f"{prefix}_lag_records", "high watermark minus position",
            [*first, "topic", "partition"], registry=registry,
        )  # fmt: skip
        self.record_age = Histogram(
            f"{prefix}_record_age_seconds",
            "Kafka to the sink: age of a batch's first record (its Kafka timestamp) when the"
            " write covering it succeeded",
            first,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
            registry=registry,
        )

    def member(self, value: str) -> ConsumerMetrics:
        """The metrics of one loop, labelled ``value`` (needs ``member_label``)."""
        view = object.__new__(ConsumerMetrics)
        view.records = self.records.labels(value)
        view.record_age = self.record_age.labels(value)
        view.dlq = _Member(self.dlq, value)
        view.lag = _Member(self.lag, value)
        return view


@dataclass
class _InFlight:
    """A batch handed to a writer and the offsets to commit once it is written."""

    future: Future[list[Rejection]]
    positions: dict[tuple[str, int], int]
    first_ms: int = 0  # the Kafka timestamp of the batch's first record (0: none)


def _reason_kind(reason: str) -> str:
    """A reason without what varies per record (offsets, values after the first colon),
    to group the ones not logged."""
    return reason.split(":", 1)[0]


class DeadLetters:
    """The original bytes, the reason and the source position, to the dead-letter topic."""

    def __init__(
        self,
        sink: KafkaSink,
        topic: str,
        metrics: ConsumerMetrics,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.sink = sink
        self.topic = topic
        self.headers = headers or []  # on every dead letter (kafka2webhook: the endpoint)
        self.metrics = metrics
        # counted per record (walcast_..._dead_letters), logged as a sample and a rate
        self.log = SampledLog(log, "dead letters")

    def send(self, origin: Origin, reason: str, kind: str) -> None:
        headers = [
            ("walcast-error", reason.encode()[:4000]),
            ("walcast-error-kind", kind.encode()),
            ("walcast-source-topic", origin.topic.encode()),
            ("walcast-source-partition", str(origin.partition).encode()),
            ("walcast-source-offset", str(origin.offset).encode()),
            *self.headers,
        ]
        self.sink.write(Outgoing(self.topic, origin.key, origin.value, headers), 0)
        self.metrics.dlq.labels(kind).inc()
        self.log.warning(
            _reason_kind(reason),
            "dead letter from %s[%d]@%d: %s",
            origin.topic,
            origin.partition,
            origin.offset,
            reason,
        )

    def flush(self, timeout_s: float) -> None:
        self.sink.flush(timeout_s)
        self.log.tick()

    def close(self) -> None:
        self.sink.close()


ConsumerFactory = Callable[[dict[str, Any]], Consumer]
Check = Callable[[], tuple[bool, str]]
"""An ops check: healthy or not, and what it saw (``shared.service.Runner``)."""


class LoopLink:
    """What a sink, built before its loop, calls on that loop once it runs: :meth:`wait`
    (back off on the loop's thread with the partitions paused and the membership kept:
    :meth:`ConsumerLoop.wait`) and :meth:`dead_letter` (a record the sink refuses out of
    band, sent to the dead-letter topic before the sink goes on). Made first, handed to
    the sink, then to the loop, which attaches itself; until then ``wait`` sleeps on the
    stop event and ``dead_letter`` is an error (no sink refuses a record before it runs)."""

    def __init__(self, stop_event: threading.Event) -> None:
        self.stop_event = stop_event
        self.loop: ConsumerLoop[Any] | None = None

    def wait(self, seconds: float) -> None:
        loop = self.loop
        if loop is None:
            self.stop_event.wait(seconds)
        else:
            loop.wait(seconds)

    def dead_letter(self, origin: Origin, reason: str) -> None:
        loop = self.loop
        if loop is None:
            raise RetriableError("a dead letter before the consumer loop runs")
        loop.dead_letters.send(origin, reason, "rejected")
        loop.dead_letters.flush(60)


class ConsumerLoop(Generic[B]):
    """One consumer-group member feeding one sink (see the module doc).

    ``sink`` is built before the loop; ``link`` (a :class:`LoopLink`), when the sink holds
    one, is how it backs off on the loop's thread. ``decoder`` reads each record
    (:mod:`shared.records`). ``make_consumer`` builds the Kafka consumer from its
    configuration (tests pass fakes). A replay passes ``start`` (position the partitions
    instead of using the group's offsets; nothing is committed) and ``until`` (stop once
    every partition reached this offset).
    """

    def __init__(
        self,
        *,
        name: str,
        kafka: KafkaSettings,
        consumer: ConsumerSettings,
        batch: BatchSettings,
        retry: BackoffPolicy,
        metrics: ConsumerMetrics,
        sink: BatchSink[B],
        stop_event: threading.Event,
        group_id: str | None = None,
        start: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        until: dict[tuple[str, int], int] | None = None,
        make_consumer: ConsumerFactory = Consumer,
        dead_letters: DeadLetters | None = None,
        decoder: RecordDecoder | None = None,
        dead_letter_headers: list[tuple[str, bytes]] | None = None,
        link: LoopLink | None = None,
    ) -> None:
        self.name = name
        # What a record is (shared.records): chosen by the service; by default walcast's
        # change events as consumer.input_format says, without a schema registry.
        self.decoder = decoder or change_events(consumer.input_format, None)
        self.kafka = kafka
        self.c = consumer
        self.b = batch
        self.retry = retry
        self.metrics = metrics
        self.stop_event = stop_event
        self.group_id = group_id or consumer.group_id
        self.start = start
        self.until = until
        self.make_consumer = make_consumer
        self.last_loop = time.monotonic()
        self.dead_letters = dead_letters or DeadLetters(
            KafkaSink(
                {**kafka.client_config(), "linger.ms": 5},
                max_inflight_bytes=16 * 1024 * 1024,
                while_waiting=self.tick,
            ),
            consumer.dlq_topic,
            metrics,
            dead_letter_headers,
        )
        self.sink = sink
        if link is not None:
            link.loop = self
        self.batch: B = self.sink.new_batch()
        self.positions: dict[tuple[str, int], int] = {}
        self.batch_started = 0.0
        self.batch_first_ms = 0
        self.flushing = False
        self.consumer: Consumer | None = None
        self.checkpointer: KafkaOffsetCheckpointer | None = None
        self.assigned: list[TopicPartition] = []
        self.held: list[Message] = []
        self.paused = False
        self.in_callback = False
        self.inflight: deque[_InFlight] = deque()
        self.unconfirmed: dict[tuple[str, int], int] = {}  # committed without waiting
        self.writer: ThreadPoolExecutor | None = None
        self.next_lag = 0.0
        self.revoke_failure: BaseException | None = None
        # Readiness: the member joined the group (an assignment arrived, maybe empty when
        # there are more members than partitions) — not merely created its consumer.
        self.joined = False

    def tick(self) -> None:
        """The loop is alive (liveness: ``/health``)."""
        self.last_loop = time.monotonic()

    def checks(self) -> tuple[Check, Check]:
        """This member's ops checks, the same in every service: *alive* (``/health``) —
        the loop went round within max(120 s, ``consumer.max_poll_interval_ms``), and
        *consuming* (``/ready``) — the member joined the group and got its assignment (a
        restart after a kill waits up to ``consumer.session_timeout_ms`` for the old
        member's share; an assignment may be empty with more members than partitions)."""
        stall = max(120.0, self.c.max_poll_interval_ms / 1000)

        def alive() -> tuple[bool, str]:
            ago = time.monotonic() - self.last_loop
            return ago < stall, f"last loop {ago:.1f}s ago"

        def consuming() -> tuple[bool, str]:
            ok = self.consumer is not None and self.joined
            return ok, f"{len(self.assigned)} partitions assigned" if ok else "joining the group"

        return alive, consuming

    def consumer_config(self) -> dict[str, Any]:
        c = self.c
        return {
            **self.kafka.client_config(),
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": c.auto_offset_reset,
            "queued.max.messages.kbytes": max(c.max_queue_bytes // 1024, 1024),
            "fetch.max.bytes": min(c.max_queue_bytes, 50 * 1024 * 1024),
            "fetch.queue.backoff.ms": c.fetch_backoff_ms,
            "session.timeout.ms": c.session_timeout_ms,
            "max.poll.interval.ms": c.max_poll_interval_ms,
            "partition.assignment.strategy": "cooperative-sticky",
            **({"group.instance.id": c.group_instance_id} if c.group_instance_id else {}),
        }

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped; transient failures reconnect with the configured backoff
        (what was not committed is read again)."""
        call_with_retry(
            self.run_once, policy=self.retry, what=self.name, sleep=self.stop_event.wait
        )

    def run_once(self) -> None:
        ensure_topic(
            self.kafka.client_config(),
            self.c.dlq_topic,
            self.c.dlq_partitions,
            self.c.dlq_replication_factor,
        )
        # A reconnect starts clean: whatever the failed attempt held is read again (and a
        # position it had not written must never be committed by this one).
        self.batch = self.sink.new_batch()
        self.positions = {}
        self.held = []
        self.unconfirmed = {}
        self.paused = False
        self.revoke_failure = None
        self.joined = self.start is not None  # a replay assigns its partitions itself
        checkpointer = self.checkpointer = KafkaOffsetCheckpointer(
            timeout_s=self.c.commit_timeout_s
        )
        consumer = self.make_consumer(
            {**self.consumer_config(), "on_commit": self.checkpointer.on_commit}
        )
        self.consumer = consumer
        self.checkpointer.consumer = consumer
        writer = self.writer = ThreadPoolExecutor(
            self.b.concurrency, thread_name_prefix=f"{self.name}-write"
        )
        try:
            if self.start is not None:
                self.start(consumer, self._partitions(consumer))
            else:
                consumer.subscribe(
                    list(self.c.topics),
                    on_assign=self._session_only(self._on_assign),
                    on_revoke=self._session_only(self._on_revoke),
                    on_lost=self._session_only(self._on_lost),
                )
            b = self.b
            while not self.stop_event.is_set():
                self.tick()
                if self.held:
                    records, self.held = self.held, []
                else:
                    timeout = 0.2
                    if self.batch.records:  # never past the batch's deadline
                        left = b.max_wait_s - (time.monotonic() - self.batch_started)
                        timeout = min(timeout, max(left, 0.0))
                    records = consumer.consume(min(b.max_docs, 10_000), timeout=timeout)
                self._check_revoke()  # before a record of this member's kept partitions
                if records:
                    self.metrics.records.inc(len(records))
                for msg in records:
                    self.handle(msg)
                if self.batch.records and (
                    len(self.batch) >= b.max_docs
                    or self.batch.bytes >= b.max_bytes
                    or time.monotonic() - self.batch_started >= b.max_wait_s
                ):
                    self.flush(drain=False)
                elif not self.batch.records and self.positions:
                    self.flush(drain=False)  # only skipped records: commit them
                elif self.inflight and self.inflight[0].future.done():
                    self.collect(block=False)  # commit as soon as writes are done
                self.update_lag()
                if self.until is not None and self._reached_end():
                    self.flush()
                    return
            self.flush()
        finally:
            self.consumer = None
            self._abandon()
            writer.shutdown(wait=True)
            try:
                close_consumer(
                    consumer, timeout_s=self.c.commit_timeout_s, stuck=checkpointer.stuck
                )
            finally:
                self.dead_letters.close()

    def handle(self, msg: Message) -> None:
        """One record: the hot path."""
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            raise KafkaException(err)
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None
        assert partition is not None
        assert offset is not None
        value = msg.value()
        if not self.batch.records:
            self.batch_first_ms = msg.timestamp()[1]
        origin = Origin(topic, partition, offset, msg.key(), value or b"")
        try:
            views = self.decoder(msg)
        except Exception as exc:
            # The one per-record boundary: whatever a decoder fails with on this record
            # makes it a dead letter with the reason, never a stop of the sink (which would
            # read it again, forever). Only walcast's own errors about the service (the
            # registry unreachable, a setting missing) and a stop pass.
            if limits.passes(exc):
                raise
            self.dead_letters.send(origin, str(limits.unreadable(exc)), "poison")
            self._mark(topic, partition, offset)
            return
        if not views:  # a Debezium tombstone or message: nothing to apply
            self._mark(topic, partition, offset)
        for ev in views:
            self.apply(ev, origin)

    def apply(self, ev: EventView, origin: Origin) -> None:
        """One decoded event of the record at ``origin``: a control event is a barrier
        (everything before it written and committed, then it); a data event goes into
        the batch."""
        topic, partition, offset = origin.topic, origin.partition, origin.offset
        if ev.op in CONTROL_OPS:
            self.flush()  # the data before it is written and committed first
            self.sink.control(ev)
            self._mark(topic, partition, offset)
            self.flush()  # commit the control event itself
            return
        if not self.batch.records:
            self.batch_started = time.monotonic()
        reason = self.sink.add(self.batch, ev, origin)
        if reason is not None:
            self.dead_letters.send(origin, reason, "rejected")
        key = (topic, partition)  # _mark, inline: once per record
        if offset > self.positions.get(key, -1):
            self.positions[key] = offset

    def _mark(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        if offset > self.positions.get(key, -1):
            self.positions[key] = offset

    def flush(self, *, drain: bool = True) -> None:
        """Hand the batch to a writer and commit what finished writes covered. With
        ``drain`` (control events, revocation, stop) also wait for every write and commit
        it, so nothing is in flight when this returns."""
        if self.flushing:
            return
        self._check_revoke()
        self.flushing = True
        try:
            self.collect(block=False)
            self.resume()  # partitions paused by a backoff on this thread
            if self.batch.records:
                assert self.writer is not None
                while len(self.inflight) >= self.b.concurrency:
                    self._collect_oldest()
                before = tuple(f.future for f in self.inflight)
                batch, self.batch = self.batch, self.sink.new_batch()
                future = self.writer.submit(self.sink.write, batch, self._writer_sleep, before)
                self.inflight.append(_InFlight(future, self.positions, self.batch_first_ms))
            elif self.positions:  # only skipped records (dead letters, control events)
                done: Future[list[Rejection]] = Future()
                done.set_result([])
                self.inflight.append(_InFlight(done, self.positions))  # committed in turn
            self.positions = {}
            if drain:
                self.collect(block=True)
                self._commit({}, wait=True)  # the partitions may change owner next
        finally:
            self.flushing = False

    def collect(self, *, block: bool) -> None:
        """Settle finished writes, oldest first (with ``block``: all of them, waiting)."""
        while self.inflight and (block or self.inflight[0].future.done()):
            self._collect_oldest(wait=block)
        self.resume()

    def _collect_oldest(self, *, wait: bool = False) -> None:
        """Wait for the oldest write; dead-letter what it refused; commit its offsets
        (without waiting for the broker's answer unless ``wait``: see
        KafkaOffsetCheckpointer). Its failure is raised here (the uncommitted records are
        read again after the reconnect)."""
        flight = self.inflight[0]
        self._await(flight.future)
        if not self.inflight or self.inflight[0] is not flight:
            return  # abandoned meanwhile (partitions lost): nothing of it is committed
        self.inflight.popleft()
        for origin, reason in flight.future.result():
            self.dead_letters.send(origin, reason, "rejected")
        self.dead_letters.flush(60)
        failpoint("consumer.batch_written")  # the sink holds the batch; offsets not committed
        self._commit(flight.positions, wait)
        if flight.first_ms > 0:
            self.metrics.record_age.observe(max(0.0, time.time() - flight.first_ms / 1000))

    def _commit(self, positions: dict[tuple[str, int], int], wait: bool) -> None:
        """Commit ``positions``; with ``wait``, also what was committed without waiting
        before (sent again, in order after it: once this answer is in, so is theirs)."""
        self._check_revoke()
        if self.checkpointer is None or self.start is not None:
            return
        if wait:
            positions = {**self.unconfirmed, **positions}
            self.unconfirmed = {}
        elif positions:
            self.unconfirmed.update(positions)
        self.checkpointer.commit(positions, wait=wait)

    def _await(self, future: Future[list[Rejection]]) -> None:
        """Block until the write is done. A write that takes long (the sink is slow or
        down) pauses the partitions and keeps polling, so the member stays in the group
        and nothing more is fetched; inside a rebalance callback it just blocks."""
        done, _ = wait_for([future], timeout=1.0)
        if done or self.consumer is None or self.in_callback:
            future.exception()  # wait
            return
        self._pause()
        while not future.done():
            self.tick()
            msg = self.consumer.poll(0.2)
            if msg is not None:
                self.held.append(msg)

    def _pause(self) -> None:
        if not self.paused and self.consumer is not None:
            assignment = self.consumer.assignment()
            if assignment:
                self.consumer.pause(assignment)
            self.paused = True

    def _check_revoke(self) -> None:
        """Raise when a flush on revocation failed in this session (see ``_on_revoke``)."""
        if self.revoke_failure is not None:
            raise RetriableError(
                "a flush on partition revocation failed: the session restarts from the"
                " committed offsets"
            ) from self.revoke_failure

    def _abandon(self) -> None:
        """Leaving without committing: let the writes in flight end (their records are
        uncommitted, so they are read again; idempotent sinks make that harmless)."""
        flights, self.inflight = self.inflight, deque()
        for flight in flights:
            flight.future.exception()  # wait; a failure is moot now

    def _writer_sleep(self, seconds: float) -> None:
        if self.stop_event.wait(seconds):
            raise RetriableError("stopping while waiting to retry")

    def wait(self, seconds: float) -> None:
        """Back off without leaving the group: the partitions stay paused until the write
        that failed went through (``resume``), so nothing is fetched meanwhile; the
        consumer is polled to keep its membership (a record fetched before the pause is
        held for later, never dropped)."""
        consumer = self.consumer
        deadline = time.monotonic() + seconds
        if consumer is None:
            self.stop_event.wait(seconds)
            return
        self._pause()
        while time.monotonic() < deadline and not self.stop_event.is_set():
            self.tick()
            msg = consumer.poll(min(0.2, max(0.0, deadline - time.monotonic())))
            if msg is not None:
                self.held.append(msg)
        if self.stop_event.is_set():
            raise RetriableError("stopping while waiting to retry")

    def resume(self) -> None:
        if self.paused and self.consumer is not None:
            assignment = self.consumer.assignment()
            if assignment:
                self.consumer.resume(assignment)
        self.paused = False

    # -- group membership --------------------------------------------------------------

    def _session_only(
        self, callback: Callable[[Consumer, list[TopicPartition]], None]
    ) -> Callable[[Consumer, list[TopicPartition]], None]:
        """``callback`` served only while its consumer is this session's. The revocation
        a closing consumer serves (after the session ended, maybe on a background thread:
        see ``close_consumer``) must not touch the next session's state; the session's
        last flush already committed what it wrote."""

        def served(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            if consumer is self.consumer:
                callback(consumer, partitions)
            else:
                log.debug(
                    "%s of %s by a closing consumer: ignored", callback.__name__, _names(partitions)
                )

        return served

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.paused and partitions:
            consumer.pause(partitions)  # newly assigned during a backoff: paused as well
        elif partitions:
            # librdkafka keeps a partition's pause across losing and regaining it: one this
            # member paused before a lost session or a revocation would never be fetched
            self._unpause(consumer, partitions)
        self.assigned = list(consumer.assignment())
        self.joined = True  # a member of the group, consuming what it was given
        log.info("assigned %s", _names(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Flush what is in hand before the partitions go to another member."""
        self.held = [m for m in self.held if not _in(m, partitions)]
        if self.flushing:
            # Served by the poll of a flush waiting for a write: that flush goes on with
            # the batch in hand and commits it once written. Dropping the batch here would
            # lose the records of the partitions this member keeps; those of the revoked
            # ones are written (harmless) and committed after them (never past a record
            # not written).
            log.info("revoked %s while flushing: the batch in hand is written", _names(partitions))
            return
        log.info("revoked %s: flushing", _names(partitions))
        self.in_callback = True
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - raised from the loop, not the callback
            # The batch is lost with records of the partitions this member keeps (under
            # cooperative-sticky assignment it keeps some): its position there is past
            # them, so any later commit would skip records never written. Nothing more is
            # committed in this session; the loop raises, and the next session reads
            # again from the committed offsets.
            log.warning("flush on revoke failed: %s; the session restarts", exc)
            self.revoke_failure = exc
            self._abandon()
        finally:
            self.in_callback = False
        self.batch.clear()
        self.positions = {}
        self.held = [m for m in self.held if not _in(m, partitions)]
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.unconfirmed = {k: o for k, o in self.unconfirmed.items() if k not in gone}
        self._unpause(consumer, partitions)  # they may come back: not paused (_on_assign)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning(
            "lost %s (session expired): uncommitted records will be re-read", _names(partitions)
        )
        self.joined = False
        self._abandon()
        self.batch.clear()
        self.positions = {}
        self.held = []
        self.unconfirmed = {}
        # The writes that paused them are abandoned: nothing to wait for any more, and a
        # pause would outlive the assignment (see _on_assign).
        self._unpause(consumer, partitions)
        self.paused = False

    @staticmethod
    def _unpause(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            try:
                consumer.resume(partitions)
            except KafkaException as exc:  # not owned any more: nothing to resume
                log.debug("resume of %s: %s", _names(partitions), exc)

    def _partitions(self, consumer: Consumer) -> list[TopicPartition]:
        parts: list[TopicPartition] = []
        for topic in self.c.topics:
            md = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if md is None or md.error is not None:
                raise PermanentError(
                    f"Kafka topic {topic!r} does not exist", hint="check consumer.topics"
                )
            parts.extend(TopicPartition(topic, p) for p in sorted(md.partitions))
        return parts

    def _reached_end(self) -> bool:
        assert self.until is not None
        assert self.consumer is not None
        if self.batch.records or self.held or self.inflight:
            return False
        for tp in self.consumer.position(list(self.consumer.assignment())):
            end = self.until.get((tp.topic, tp.partition), 0)
            if tp.offset < end:
                return False
        return True

    def update_lag(self) -> None:
        now = time.monotonic()
        consumer = self.consumer
        if now < self.next_lag or consumer is None:
            return
        self.next_lag = now + 10
        try:
            for tp in consumer.position(list(consumer.assignment())):
                # From the last fetch response: no broker round trip on the hot path.
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:
                    continue
                pos = tp.offset if tp.offset >= 0 else high
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(max(0, high - pos))
        except KafkaException as exc:
            log.debug("lag not updated: %s", exc)


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"


def _in(msg: Message, partitions: list[TopicPartition]) -> bool:
    return any(msg.topic() == tp.topic and msg.partition() == tp.partition for tp in partitions)
