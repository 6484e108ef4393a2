"""Where a verification marker landed in Kafka, and waiting until a sink has applied
everything up to it (docs/design.md#verification, steps 2 and 3).

The verifier notes each partition's end offset before it asks for the marker
(:func:`end_offsets`); once pg2kafka's slot has passed the marker (every copy of it
acknowledged by Kafka: checkpoint last), the copies lie between those offsets and the
partitions' ends, and :func:`find_marks` reads just that stretch. :func:`wait_applied`
then waits until the sink's applied offsets pass every copy — a consumer group's
committed offsets, a Structured Streaming checkpoint's — failing only after
``timeout_s`` without progress, with how far the sink got.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition

from shared.avro import RegistryDecoder
from shared.contract.event import EventDecodeError
from shared.errors import PermanentError, RetriableError, WaitExpiredError
from shared.formats.debezium_input import events as debezium_events
from shared.kafka import topic_partitions
from shared.retry import BackoffPolicy, call_with_retry
from shared.settings import SchemaRegistrySettings

T = TypeVar("T")
log = logging.getLogger(__name__)

Partition = tuple[str, int]


class MarkNotAppliedError(WaitExpiredError):
    """The sink made no progress towards a marker within the time allowed."""


def end_offsets(consumer: Consumer, topics: Iterable[str]) -> dict[Partition, int]:
    """Each partition's end offset now. A topic of no partitions — missing, or its
    metadata not read (a broker busy or restarting) — is a :class:`RetriableError`: an
    empty answer here would make the look for the marker find nothing."""
    out: dict[Partition, int] = {}
    for topic in topics:
        parts = topic_partitions(consumer, topic)
        if not parts:
            raise RetriableError(f"verify: the partitions of topic {topic!r} could not be read")
        for tp in parts:
            _low, high = consumer.get_watermark_offsets(tp, timeout=10)
            out[(tp.topic, tp.partition)] = high
    return out


@dataclass
class Look:
    """What one look for a marker read: per partition the stretch ``[start, end)``, how
    many records came back and the last offset among them, and the offset of each copy
    found. Its :meth:`describe` goes into the error when no look found a copy."""

    found: dict[Partition, int] = field(default_factory=dict)
    stretch: dict[Partition, tuple[int, int]] = field(default_factory=dict)
    read: dict[Partition, tuple[int, int]] = field(default_factory=dict)  # (count, last)
    unreadable: list[str] = field(default_factory=list)  # a record with the id, not decoded

    def describe(self) -> str:
        parts = []
        for (t, n), (start, end) in sorted(self.stretch.items()):
            count, last = self.read.get((t, n), (0, -1))
            parts.append(f"{t}[{n}] {start}..{end} ({count} read, last {last})")
        text = "; ".join(parts) or "no partition had records after the marker was asked for"
        if self.unreadable:
            text += f"; records holding the id but unreadable: {', '.join(self.unreadable[:5])}"
        return text


def find_marks(
    consumer: Consumer,
    since: dict[Partition, int],
    mark_id: str,
    table: tuple[str, str],
    from_avro: Callable[[bytes], bytes] | None = None,
) -> Look:
    """Each copy of the marker ``mark_id`` for ``table`` written after ``since``, reading
    each partition from there to its end now (call it once pg2kafka's slot has passed the
    marker: every copy is then in Kafka). A partition without a copy carries none of the
    table's rows. ``from_avro``: an Avro record (the Confluent wire format, a first byte
    of 0) as its JSON event (the sink's registry decoder); without it Avro records are
    not looked at. ``consumer``: one made for this look (a reused one could carry a
    position or fetched records of an earlier assignment into it)."""
    look = Look()
    ends = end_offsets(consumer, {t for t, _ in since})
    todo = {p: o for p, o in since.items() if ends.get(p, o) > o}
    look.stretch = {p: (o, ends[p]) for p, o in todo.items()}
    if not todo:
        return look
    consumer.assign([TopicPartition(t, p, o) for (t, p), o in todo.items()])
    done: set[Partition] = set()
    needle = mark_id.encode()
    deadline = time.monotonic() + 120
    try:
        while len(done) < len(todo):
            if time.monotonic() > deadline:
                left = sorted(set(todo) - done)
                raise RetriableError(
                    f"verify: reading the marker's partitions took too long: {left}"
                )
            for msg in consumer.consume(500, 1.0):
                if msg.error():
                    continue
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is None or partition is None or offset is None:
                    continue
                p = (topic, partition)
                count, _last = look.read.get(p, (0, -1))
                look.read[p] = (count + 1, offset)
                value = msg.value() or b""
                # The mark's id is in the record's bytes in either encoding (Avro writes a
                # string's UTF-8 as it is): only those records are decoded.
                if needle in value:
                    if value[:1] == b"\x00" and from_avro is not None:
                        try:
                            value = from_avro(value)
                        except EventDecodeError as exc:
                            look.unreadable.append(f"{topic}[{partition}]@{offset}: {exc}")
                            value = b""  # unreadable: the sink dead-letters it, no mark
                    if _is_mark(value, mark_id, table):
                        look.found.setdefault(p, offset)
                if offset + 1 >= ends[p]:
                    done.add(p)
            for p in todo:
                # past the end though no record there was read: what follows the last
                # record is no record (a transaction's marker, an aborted batch)
                if p not in done and _position(consumer, p) >= ends[p]:
                    done.add(p)
    finally:
        consumer.unassign()
    return look


def _position(consumer: Consumer, p: Partition) -> int:
    try:
        (tp,) = consumer.position([TopicPartition(p[0], p[1])])
    except KafkaException:
        return -1
    return int(tp.offset) if tp.offset >= 0 else -1


def _is_mark(value: bytes, mark_id: str, table: tuple[str, str]) -> bool:
    """Whether a record (JSON) is the marker: walcast's ``verify`` event, or pg2kafka's
    Debezium-format marker record (read as the sinks read it)."""
    try:
        ev = orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    if isinstance(ev, dict) and "payload" in ev:  # a Debezium record (Connect's JSON)
        try:
            return any(_is_mark_event(e, mark_id, table) for e in debezium_events(None, value))
        except EventDecodeError:
            return False
    return _is_mark_event(ev, mark_id, table)


def _is_mark_event(ev: Any, mark_id: str, table: tuple[str, str]) -> bool:
    return (
        isinstance(ev, dict)
        and ev.get("op") == "verify"
        and (ev.get("schema"), ev.get("table")) == table
        and isinstance(ev.get("verify"), dict)
        and ev["verify"].get("id") == mark_id
    )


def wait_applied(
    applied: Callable[[], dict[Partition, int]],
    marks: dict[Partition, int],
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Return once ``applied()`` — per partition, the next offset the sink will apply
    (a committed offset) — is past every marker copy in ``marks``; raise
    :class:`MarkNotAppliedError` after ``timeout_s`` in which no partition moved closer."""
    last_progress = clock()
    best: dict[Partition, int] = {}
    while True:
        now = applied()
        behind = {p: o for p, o in marks.items() if now.get(p, -1) <= o}
        if not behind:
            return
        moved = any(now.get(p, -1) > best.get(p, -1) for p in behind)
        for p in behind:
            best[p] = max(best.get(p, -1), now.get(p, -1))
        if moved:
            last_progress = clock()
        elif clock() - last_progress > timeout_s:
            shown = ", ".join(
                f"{t}[{n}] at {best.get((t, n), -1)} of {o + 1}"
                for (t, n), o in sorted(behind.items())
            )
            raise MarkNotAppliedError(
                f"verify: the sink has not applied up to the marker within {timeout_s:.0f}s"
                f" without progress ({shown}): is it running?"
            )
        sleep(0.2)


def avro_reader(registry: SchemaRegistrySettings) -> Callable[[bytes], bytes] | None:
    """How a sink's verifier reads Avro records (the registry's decoder), or None when the
    sink has no registry: what :class:`GroupMarks` takes as ``from_avro``."""
    return RegistryDecoder(registry.client()).decode if registry.url else None


class GroupMarks:
    """Markers in a consumer group's topics, and the group's committed offsets as what
    the sink applied — the sinks that commit offsets only after writing what they cover
    (kafka2search; kafka2spark after each batch's Delta commits). ``config``: the Kafka
    client's; ``group_id``: the sink's group; ``topics``: what it reads."""

    def __init__(
        self,
        config: dict[str, Any],
        group_id: str,
        topics: Sequence[str],
        retry: BackoffPolicy | None = None,
        from_avro: Callable[[bytes], bytes] | None = None,
    ) -> None:
        # Kafka's transient failures (a restarting broker, a coordinator loading) are
        # waited out, up to the policy's bound.
        self.retry = retry or BackoffPolicy(max_s=5.0, give_up_after_s=120.0)
        self._config = {**config, "group.id": group_id, "enable.auto.commit": False,
                        "auto.offset.reset": "earliest"}  # fmt: skip
        self.consumer = Consumer(self._config)  # end offsets, committed offsets
        self.topics = list(topics)
        self.from_avro = from_avro  # Avro records as JSON events (find_marks)
        self._since: dict[Partition, int] = {}

    def close(self) -> None:
        self.consumer.close()

    def _retried(self, fn: Callable[[], T], what: str) -> T:
        return call_with_retry(fn, policy=self.retry, what=f"verify: {what}")

    def before_mark(self) -> None:
        self._since = self._retried(
            lambda: end_offsets(self.consumer, self.topics), "read the topics' end offsets"
        )

    def applied(self) -> dict[Partition, int]:
        """The group's committed offsets (the next record it will apply), per partition."""

        def read() -> dict[Partition, int]:
            parts = [tp for t in self.topics for tp in topic_partitions(self.consumer, t)]
            done = self.consumer.committed(parts, timeout=10) if parts else []
            return {(tp.topic, tp.partition): int(tp.offset) for tp in done if tp.offset >= 0}

        return self._retried(read, "read the group's committed offsets")

    def _find(self, mark_id: str, table: tuple[str, str]) -> Look:
        """The marker's copies for ``table``, by a consumer made for this look: a reused
        one could carry a position or fetched records of an earlier assignment into it."""

        def look() -> Look:
            consumer = Consumer(self._config)
            try:
                return find_marks(consumer, self._since, mark_id, table, self.from_avro)
            finally:
                consumer.close()

        return self._retried(look, "find the marker in the topics")

    def wait_for_mark(
        self, sink: str, mark_id: str, tables: Sequence[tuple[str, str]], timeout_s: float
    ) -> None:
        """Find the marker's copies for each table, then wait for the group to pass them;
        PermanentError when a table's marker is in none of the topics."""
        marks: dict[Partition, int] = {}
        for table in tables:
            look = self._find(mark_id, table)
            if not look.found:
                raise PermanentError(
                    f"verify: the marker for {'.'.join(table)} is in none of the topics"
                    f" {sink} reads ({', '.join(self.topics)}; read: {look.describe()})",
                    hint="the sink's topics must hold the topic pg2kafka writes the table to;"
                    " a topic of the Debezium connector's own records carries no marker:"
                    " verify needs pg2kafka's records (its walcast or debezium format)",
                )
            for p, o in look.found.items():
                marks[p] = max(marks.get(p, -1), o)
        wait_applied(self.applied, marks, timeout_s)
