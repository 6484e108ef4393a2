"""(Just over 600 lines: the producer and the consumer-side helpers every service shares —
topics, offsets, lag, replay ranges — kept together because they share one client
configuration and one error mapping.)

The Kafka producer every walcast service writes with: idempotent, acks=all,
memory-guarded (pg2kafka's change and event topics, the consumers' dead-letter topics).

:class:`KafkaSink` implements :class:`shared.interfaces.Sink` with item = an outgoing
message and position = the transaction sequence number it belongs to. ``on_durable(seq)``
runs once per message after Kafka acknowledged it (from inside ``poll``, on the caller's
thread). A delivery failure (librdkafka gave up after ``delivery_timeout_ms``) is kept and
raised from the next ``write`` / ``poll`` / ``flush``: the caller stops before it could
checkpoint anything past the lost message (pg2kafka: the slot's confirmed LSN; consumers:
their committed offsets), and the restart sends it again.

Memory guard: ``inflight_bytes`` counts key + value bytes handed to the producer and not
yet acknowledged. ``write`` blocks while the budget is used up, calling ``while_waiting``
(pg2kafka sends standby status updates there, so Postgres keeps the connection).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # stubs omit these
    AdminClient,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

from shared.errors import NoAnswerError, PermanentError, RetriableError
from shared.interfaces import Checkpointer, Sink

log = logging.getLogger(__name__)


@dataclass(slots=True)  # one per record: not frozen (frozen __init__ costs); never mutated
class Outgoing:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone
    headers: list[tuple[str, bytes]] | None = None
    partition: int | None = None


class KafkaSink(Sink[Outgoing, int]):
    def __init__(
        self,
        config: dict[str, Any],
        *,
        max_inflight_bytes: int,
        while_waiting: Callable[[], None] = lambda: None,
    ) -> None:
        conf = {
            **config,
            "enable.idempotence": True,
            "acks": "all",
            # Let the memory guard, not librdkafka's queue, decide when to wait.
            "queue.buffering.max.kbytes": max(max_inflight_bytes // 1024 * 2, 1024),
            "queue.buffering.max.messages": 2_000_000,
        }
        self.producer = Producer(conf)
        self.max_inflight_bytes = max_inflight_bytes
        self.inflight_bytes = 0
        self.while_waiting = while_waiting
        self._on_durable: Callable[[int], None] = lambda _seq: None
        self._failure: KafkaError | None = None
        self.waits = 0
        self.outstanding = 0  # messages handed over, not yet reported delivered or failed
        self.last_ack_at = time.monotonic()

    def set_listener(self, on_durable: Callable[[int], None]) -> None:
        self._on_durable = on_durable

    def write(self, item: Outgoing, position: int) -> None:
        size = len(item.value or b"") + (len(item.key) if item.key else 0)
        self._raise_failure()
        if self.inflight_bytes + size > self.max_inflight_bytes and self.inflight_bytes > 0:
            self.waits += 1
            while self.inflight_bytes + size > self.max_inflight_bytes and self.inflight_bytes > 0:
                self.producer.poll(0.05)
                self._raise_failure()
                self.while_waiting()
        self.inflight_bytes += size

        def delivered(err: KafkaError | None, _msg: object) -> None:
            self.inflight_bytes -= size
            self.outstanding -= 1
            if err is not None:
                if self._failure is None:
                    self._failure = err
                return
            self.last_ack_at = time.monotonic()
            self._on_durable(position)

        kwargs: dict[str, Any] | None = None
        if item.headers or item.partition is not None:
            kwargs = {}
            if item.headers:
                kwargs["headers"] = item.headers
            if item.partition is not None:
                kwargs["partition"] = item.partition
        while True:
            try:
                if kwargs is None:  # per record: most records have neither
                    self.producer.produce(item.topic, item.value, item.key, on_delivery=delivered)
                else:
                    self.producer.produce(
                        item.topic, item.value, item.key, on_delivery=delivered, **kwargs
                    )
                if self.outstanding == 0:
                    self.last_ack_at = time.monotonic()  # the silence starts now
                self.outstanding += 1
                break
            except BufferError:
                self.producer.poll(0.05)
                self.while_waiting()
            except KafkaException as exc:
                self.inflight_bytes -= size
                raise _classified(exc.args[0]) from exc

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve delivery callbacks; raise a delivery failure seen so far."""
        self.producer.poll(timeout_s)
        self._raise_failure()

    def flush(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.producer) > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RetriableError(f"{len(self.producer)} messages still unacknowledged")
            self.producer.flush(min(remaining, 1.0))
            self._raise_failure()
            self.while_waiting()
        self._raise_failure()

    def close(self) -> None:
        # Unacknowledged messages are simply redelivered after restart: never confirmed.
        self.producer.flush(5)

    def stalled_for(self) -> float:
        """Seconds messages have been waiting without any acknowledgement (0 if none)."""
        return time.monotonic() - self.last_ack_at if self.outstanding else 0.0

    def partitions(self, topic: str, wait_s: float = 0.0) -> int:
        return partition_count(self.producer, topic, wait_s)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            err = self._failure
            raise _classified(err)


def partition_count(producer: Producer, topic: str, wait_s: float = 0.0) -> int:
    """``topic``'s partition count, or a permanent error naming the missing topic. A topic
    just created may be missing from the brokers' metadata for a moment (seen on a loaded
    machine): ``wait_s`` asks again that long before calling it missing."""
    deadline = time.monotonic() + wait_s
    while True:
        md = producer.list_topics(topic, timeout=10)
        meta = md.topics.get(topic)
        if meta is not None and meta.error is None and meta.partitions:
            return len(meta.partitions)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if meta is None or meta.error is not None:
        raise PermanentError(
            f"Kafka topic {topic!r} does not exist",
            hint="create it, or set PG2KAFKA_PRODUCER__CREATE_TOPIC=true",
        )
    return len(meta.partitions)


class BulkKafkaSink:
    """A producer for bulk loads (snapshots): idempotent, acks=all, and acknowledged as a
    whole: :meth:`flush` returns once Kafka acknowledged every record written before it,
    or raises the first delivery failure. No per-record callback (librdkafka reports only
    failures): what a record costs is the ``produce`` call, which is what lets a snapshot
    keep up with Postgres.

    Memory guard: librdkafka's queue holds at most ``max_inflight_bytes`` of records not
    yet acknowledged; :meth:`write` waits for room (serving delivery reports, calling
    ``while_waiting``) instead of growing it. Callers write from one thread. Checkpoint
    last: record progress only after the :meth:`flush` that covers it.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        max_inflight_bytes: int,
        while_waiting: Callable[[], None] = lambda: None,
    ) -> None:
        self.failure: KafkaError | None = None
        self.producer = Producer(
            {
                **config,
                "enable.idempotence": True,
                "acks": "all",
                "queue.buffering.max.kbytes": max(max_inflight_bytes // 1024, 1024),
                "queue.buffering.max.messages": 2_000_000,
                "delivery.report.only.error": True,
                "on_delivery": self._failed,
            }
        )
        self.while_waiting = while_waiting
        self.waits = 0

    def _failed(self, err: KafkaError | None, _msg: object) -> None:
        if err is not None and self.failure is None:
            self.failure = err

    def write(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Queue one record (the hot loop may call ``producer.produce`` itself and come
        here only on ``BufferError``)."""
        kwargs: dict[str, Any] = {}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = headers
        while True:
            try:
                self.producer.produce(topic, value, key, **kwargs)
                return
            except BufferError:
                self.wait_for_room()
            except KafkaException as exc:
                raise _classified(exc.args[0]) from exc

    def wait_for_room(self) -> None:
        """The queue is full (the memory guard): serve acknowledgements for a moment."""
        self.waits += 1
        self.producer.poll(0.05)
        self.raise_failure()
        self.while_waiting()

    def poll(self) -> None:
        self.producer.poll(0)
        self.raise_failure()

    def flush(self, timeout_s: float) -> None:
        """Every record written so far acknowledged, or raise."""
        deadline = time.monotonic() + timeout_s
        while len(self.producer) > 0:
            if time.monotonic() > deadline:
                raise RetriableError(f"{len(self.producer)} records still unacknowledged")
            self.producer.flush(1.0)
            self.raise_failure()
            self.while_waiting()
        self.raise_failure()

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise _classified(self.failure)

    def partitions(self, topic: str, wait_s: float = 0.0) -> int:
        return partition_count(self.producer, topic, wait_s)

    def close(self) -> None:
        self.producer.flush(5)


def _classified(err: KafkaError) -> Exception:
    text = f"Kafka delivery failed: {err.str()} ({err.name()})"
    if err.code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.UNKNOWN_TOPIC_OR_PART):
        return PermanentError(text, hint="check the topic exists and the principal may write it")
    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return PermanentError(text, hint="raise the topic's max.message.bytes")
    return RetriableError(text)


def ensure_topic(
    admin_config: dict[str, Any],
    topic: str,
    partitions: int,
    replication_factor: int,
    config: dict[str, str] | None = None,
) -> bool:
    """Create ``topic`` if missing (with topic ``config``, e.g. ``max.message.bytes``);
    return True when it was created."""
    admin = AdminClient(admin_config)
    if topic in admin.list_topics(timeout=10).topics:
        return False
    new = NewTopic(topic, partitions, replication_factor, config=config or {})
    future = admin.create_topics([new])[topic]
    try:
        future.result(timeout=30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        return False
    return True


def topic_max_message_bytes(admin_config: dict[str, Any], topic: str) -> int | None:
    """The topic's ``max.message.bytes`` (its own or the broker's default), or None when
    the broker does not say (no DescribeConfigs permission)."""
    admin = AdminClient(admin_config)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=10)
    except KafkaException as exc:
        if exc.args and getattr(exc.args[0], "code", lambda: None)() in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        ):
            return None
        raise
    entry = configs.get("max.message.bytes")
    return int(entry.value) if entry is not None and entry.value is not None else None


TopicPartitionKey = tuple[str, int]


class KafkaOffsetCheckpointer(Checkpointer[dict[TopicPartitionKey, int]]):
    """Commits a consumer group's offsets: position = {(topic, partition): last offset
    processed}; the group stores offset + 1, the next record to read.

    Called only after the sink write covering those records succeeded (checkpoint last).
    ``commit(..., wait=False)`` sends the commit without waiting for the broker's answer,
    so the loop goes on reading (a synchronous commit is a broker round trip per batch);
    commits travel in order on the coordinator connection, so a later one never lands
    before an earlier one. Its result arrives through :meth:`on_commit`, which must be the
    consumer's ``on_commit`` callback. A member that hands partitions over or stops commits
    with ``wait=True`` (the default) first.

    A commit for a partition this member no longer owns (a rebalance happened) fails on
    the broker; that is harmless — the new owner re-reads from the previous commit, and
    the sinks are idempotent — so it is logged, not raised. So is a failed asynchronous
    commit: the next one supersedes it, and a crash in between only re-reads more.

    A waited-for commit has a deadline, ``timeout_s``: librdkafka's synchronous commit
    has none, and after a Kafka restart it can wait for good on a coordinator connection
    it never brings up again (seen: minutes, the request re-queued once a minute). Past
    the deadline :class:`NoAnswerError` is raised and the consumer is *stuck*
    (:attr:`stuck`): the caller stops using it, builds a new one, and closes the old one
    with :func:`close_consumer` (which waits for the stuck commit to end first).
    """

    def __init__(self, consumer: Consumer | None = None, *, timeout_s: float = 30.0) -> None:
        self.consumer = consumer  # set later when on_commit must be in the consumer's config
        self.timeout_s = timeout_s
        self.stuck: threading.Thread | None = None  # a commit that got no answer in time
        self._committed: dict[TopicPartitionKey, int] = {}

    def commit(self, position: dict[TopicPartitionKey, int], *, wait: bool = True) -> None:
        if not position:
            return
        assert self.consumer is not None, "no consumer to commit with"
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in position.items()]
        if not wait:
            self.consumer.commit(offsets=offsets, asynchronous=True)
            return
        try:
            result = self._commit_in_time(offsets)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() in _REBALANCE_CODES:
                log.warning("offset commit refused during a rebalance: %s", err.str())
                return
            raise
        self._record(result)

    def _commit_in_time(self, offsets: list[TopicPartition]) -> list[TopicPartition]:
        """The synchronous commit, on a thread of its own so its wait has a deadline."""
        consumer = self.consumer
        assert consumer is not None
        if self.stuck is not None:
            raise NoAnswerError("this consumer has an offset commit without an answer")
        answer: list[list[TopicPartition]] = []
        failure: list[BaseException] = []

        def send() -> None:
            try:
                answer.append(consumer.commit(offsets=offsets, asynchronous=False) or [])
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                failure.append(exc)

        sender = threading.Thread(target=send, name="offset-commit", daemon=True)
        sender.start()
        sender.join(self.timeout_s)
        if sender.is_alive():
            self.stuck = sender
            if stuck_clients() >= MAX_STUCK_CLIENTS:
                raise PermanentError(
                    f"offset commits got no answer on {MAX_STUCK_CLIENTS + 1} Kafka"
                    " consumers in a row, and the earlier ones are still waiting",
                    hint="the Kafka client library is stuck: the process must restart (its"
                    " supervisor starts it again); check the brokers' health",
                )
            raise NoAnswerError(
                f"the group coordinator did not answer an offset commit within"
                f" {self.timeout_s:g} s (Kafka restarted or the coordinator moved, and the"
                " client did not reach it again): reconnecting with a new consumer; records"
                " not committed are read again"
            )
        if failure:
            raise failure[0]
        return answer[0]

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The consumer's ``on_commit`` callback (served on the polling thread)."""
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            log.warning("offset commit failed (the next one supersedes it): %s", err.str())
            return
        self._record(partitions)

    def _record(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.error is not None:
                log.warning("offset commit for %s[%d] failed: %s", tp.topic, tp.partition, tp.error)
            elif tp.offset >= 0:
                key = (tp.topic, tp.partition)
                self._committed[key] = max(self._committed.get(key, -1), tp.offset - 1)

    def committed(self) -> dict[TopicPartitionKey, int] | None:
        return dict(self._committed) or None


MAX_STUCK_CLIENTS = 3
"""Consumers closing in the background behind a commit without an answer, at most: each
holds a librdkafka client and two threads until that commit ends. One more is a
permanent failure — the process restarts (its supervisor starts it again)."""

_stuck_lock = threading.Lock()
_stuck_clients = 0


def stuck_clients() -> int:
    """Consumers still closing behind a commit that got no answer."""
    return _stuck_clients


def close_consumer(
    consumer: Consumer, *, timeout_s: float, stuck: threading.Thread | None = None
) -> None:
    """Close ``consumer`` (it leaves the group), waiting ``timeout_s`` at most. A close
    that takes longer (the coordinator does not answer) goes on in the background so the
    caller can reconnect. With ``stuck`` (a commit without an answer, see
    :class:`KafkaOffsetCheckpointer`) the close starts only once that commit ended —
    closing a client another thread is still calling into is not safe — and the caller
    does not wait for it at all."""
    global _stuck_clients
    behind = stuck is not None and stuck.is_alive()
    if behind:
        with _stuck_lock:
            _stuck_clients += 1

    def close() -> None:
        global _stuck_clients
        try:
            if stuck is not None:
                stuck.join()
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer: %s", exc)
        finally:
            if behind:
                with _stuck_lock:
                    _stuck_clients -= 1

    closer = threading.Thread(target=close, name="consumer-close", daemon=True)
    closer.start()
    if behind:
        log.warning("a consumer with an unanswered offset commit closes in the background")
        return
    closer.join(timeout_s)
    if closer.is_alive():
        log.warning(
            "the consumer did not close within %g s (the group leave got no answer); it"
            " goes on closing in the background",
            timeout_s,
        )


_REBALANCE_CODES = (
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError._NO_OFFSET,
)


def topic_partitions(consumer: Consumer, topic: str) -> list[TopicPartition]:
    """The topic's partitions, or [] when it does not exist."""
    md = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None:
        return []
    return [TopicPartition(topic, p) for p in sorted(md.partitions)]


def group_lag(consumer: Consumer, topics: list[str]) -> list[dict[str, Any]]:
    """Per partition of ``topics``: the group's committed offset (None if it never
    committed), the end offset, and the lag (records not yet committed). ``consumer``
    carries the group id; it needs no subscription."""
    out: list[dict[str, Any]] = []
    for topic in topics:
        parts = topic_partitions(consumer, topic)
        for tp in consumer.committed(parts, timeout=10) if parts else []:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            done = tp.offset if tp.offset >= 0 else low
            out.append(
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "committed": tp.offset if tp.offset >= 0 else None,
                    "end": high,
                    "lag": max(0, high - done),
                }
            )
    return out


def topic_records(consumer: Consumer, topic: str) -> int:
    """Records currently held by ``topic`` (end minus start offsets; 0 if missing)."""
    total = 0
    for tp in topic_partitions(consumer, topic):
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        total += high - low
    return total


def replay_range(
    client_config: dict[str, Any],
    topics: list[str],
    from_offset: int | None,
    from_timestamp: datetime | None,
    partitions: list[int] | None,
) -> tuple[list[TopicPartition], dict[tuple[str, int], int]]:
    """Where a replay of ``topics`` starts in each partition (an offset, or the first
    record at or after a time; ``partitions``: only these), and where it ends (the end
    now)."""
    probe = Consumer({**client_config, "group.id": "walcast-replay-probe"})
    try:
        start: list[TopicPartition] = []
        until: dict[tuple[str, int], int] = {}
        for topic in topics:
            parts = topic_partitions(probe, topic)
            if not parts:
                raise PermanentError(
                    f"Kafka topic {topic!r} does not exist", hint="check consumer.topics"
                )
            if partitions is not None:
                parts = [tp for tp in parts if tp.partition in partitions]
            if from_timestamp is not None:
                ms = int(from_timestamp.timestamp() * 1000)
                parts = probe.offsets_for_times(
                    [TopicPartition(tp.topic, tp.partition, ms) for tp in parts], timeout=10
                )
            for tp in parts:
                low, high = probe.get_watermark_offsets(tp, timeout=10)
                offset = from_offset if from_offset is not None else tp.offset
                if offset is None or offset < 0:
                    offset = high  # nothing at or after the time
                start.append(TopicPartition(tp.topic, tp.partition, max(low, min(offset, high))))
                until[(tp.topic, tp.partition)] = high
    finally:
        probe.close()
    return start, until


def oldest_timestamp_s(
    client_config: dict[str, Any],
    start: list[TopicPartition],
    until: dict[tuple[str, int], int],
) -> float | None:
    """The Kafka timestamp (seconds) of the oldest of the first records a replay from
    ``start`` up to ``until`` reads; None when there is none (or none carries a time).
    A sink's replay compares its age with how long the sink remembers deleted rows."""
    probe = Consumer({**client_config, "group.id": "walcast-replay-probe",
                      "enable.auto.commit": False})  # fmt: skip
    oldest: float | None = None
    try:
        todo = [tp for tp in start if tp.offset < until[(tp.topic, tp.partition)]]
        if not todo:
            return None
        probe.assign(todo)
        pending = {(tp.topic, tp.partition) for tp in todo}
        deadline = time.monotonic() + 30
        while pending and time.monotonic() < deadline:
            msg = probe.poll(1.0)
            if msg is None or msg.error():
                continue
            key = (msg.topic() or "", msg.partition() or 0)
            if key in pending:
                pending.discard(key)
                _kind, ms = msg.timestamp()
                if ms > 0:
                    oldest = ms / 1000 if oldest is None else min(oldest, ms / 1000)
    finally:
        probe.close()
    return oldest
