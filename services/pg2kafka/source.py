"""Which source a stream carries, and what its versions mean when the source changes.

Sinks order two writes of a row by version, which is the change's LSN. LSNs order one
server's history only. A different source — a standby promoted after its primary failed,
a cluster restored from a backup or a dump — has a history of its own whose LSNs can be
lower than those already in the sinks: compared by LSN, its changes would be refused as
stale, silently. So a version is ``(epoch, lsn)`` (:func:`shared.contract.event.version`)
and a new source starts a new epoch.

The epoch lives in Kafka, next to the sinks' data, not in the database, which is the
thing that gets replaced. A stream's *destination* is where its events go (the topic, the
topic template, or the Debezium format's topic prefix): sinks compare the versions of
everything written there, so epochs are ordered per destination. Each pipeline writing
it — one (server, database, slot) — keeps its own record in the compacted
``producer.source_topic`` (key :func:`record_key`): the epoch, the server it was seen on
(system identifier, timeline) and how far it is known to have got (the LSN last
confirmed to the slot). No pipeline ever overwrites another's record, and a start-up
never takes an epoch below the highest one recorded for its destination (two clusters
left writing one topic name each start a new epoch rather than sink below the other,
which would make every later change look stale). At start-up, as leader, before
anything is sent, pg2kafka asks the server who it is (``IDENTIFY_SYSTEM``) and
:func:`judge` compares it with the destination's records:

* another system identifier: another cluster (restored from a dump, or a new server);
* another timeline: a promoted standby, or a point-in-time recovery;
* the server's flushed WAL ends below the recorded LSN: a copy restored on the same
  timeline (a file-system snapshot, a base backup). A server never loses WAL it flushed,
  and the recorded LSN is one it sent, so the same history always passes this test.

Any of them starts the next epoch, and every published table is snapshotted again: a new
slot's initial snapshot, or, when the slot came along, incremental snapshots of every
table. Their end markers (version ``(epoch, S)``) remove from the sinks every row of the
old source the new one does not have. What is not detected: a copy restored with its slot
on the same timeline that had already written past the recorded LSN before pg2kafka
looked (the record trails the slot by up to a status interval plus the Kafka round trip),
see docs/snapshots.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from services.pg2kafka.output import output_format
from services.pg2kafka.pgoutput import format_lsn
from services.pg2kafka.replication import Identity
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.contract.event import MAX_EPOCH, MAX_EPOCH_LSN
from shared.errors import PermanentError, RetriableError
from shared.kafka import ensure_topic

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SourceRecord:
    """A stream's source as last recorded: the epoch its events carry, the server they
    came from, and the highest LSN confirmed to that server's slot (0: none yet)."""

    epoch: int
    system: str
    timeline: int
    lsn: int
    slot: str = ""

    def to_json(self) -> bytes:
        return orjson.dumps({**asdict(self), "at": time.time()})

    @classmethod
    def from_json(cls, value: bytes) -> SourceRecord:
        d: dict[str, Any] = orjson.loads(value)
        return cls(
            int(d["epoch"]), str(d["system"]), int(d["timeline"]), int(d["lsn"]), str(d["slot"])
        )


def judge(record: SourceRecord | None, now: Identity) -> str | None:
    """Why the server is not the source the stream carried last (None: it is, or the
    stream has no record yet). The reason is for the operator's log."""
    if record is None:
        return None
    if now.system != record.system:
        return (
            f"the server's system identifier is {now.system}, the stream's was"
            f" {record.system}: another cluster (restored from a dump, or a new server)"
        )
    if now.timeline != record.timeline:
        return (
            f"the server is on timeline {now.timeline}, the stream was on {record.timeline}:"
            " a promoted standby or a point-in-time recovery"
        )
    if now.wal_lsn < record.lsn:
        return (
            f"the server's WAL ends at {format_lsn(now.wal_lsn)}, below"
            f" {format_lsn(record.lsn)} that the stream already carried: a copy restored"
            " from a backup"
        )
    return None


def check_lsn_range(now: Identity) -> None:
    """A version holds the LSN in 48 bits (256 TiB of WAL): beyond, epochs cannot order."""
    if now.wal_lsn > MAX_EPOCH_LSN:
        raise PermanentError(
            f"the server's WAL position {format_lsn(now.wal_lsn)} is beyond 2^48 bytes,"
            " which walcast's versions do not hold (docs/snapshots.md)",
            hint="not supported on this server",
        )


def decide(
    records: dict[bytes, SourceRecord], key: bytes, now: Identity, slot: str, dest: str
) -> tuple[SourceRecord, str | None]:
    """The record a pipeline (``key``) streams under, given every record of its
    destination, and why it is a new epoch (None: it is not).

    The epoch never goes below the destination's highest: a pipeline whose server's
    history holds that epoch (same system and timeline, WAL not behind any position
    recorded on it) adopts it; any other starts the next one.
    """
    if not records:
        return SourceRecord(0, now.system, now.timeline, 0, slot), None
    top = max(records.values(), key=lambda r: r.epoch)
    own = records.get(key)
    history = [r for r in records.values()
               if r.system == now.system and r.timeline == now.timeline]  # fmt: skip
    behind = [r for r in history if judge(r, now) is not None]
    if history and not behind and max(r.epoch for r in history) == top.epoch:
        lsn = own.lsn if own is not None and own.epoch == top.epoch else 0
        # Another pipeline of this server already began the epoch; this one's own source
        # changed all the same (its record is of another timeline, or its server is
        # behind it): the epoch is adopted, and the reason asks for its snapshots.
        own_reason = judge(own, now) if own is not None else None
        return SourceRecord(top.epoch, now.system, now.timeline, lsn, slot), own_reason
    reason = judge(behind[0] if behind else own if own is not None else top, now) or (
        f"another source (system {top.system}, timeline {top.timeline}) wrote stream"
        f" {dest} at epoch {top.epoch}, after this server's epoch"
        f" {own.epoch if own is not None else '-'}: two sources write one destination,"
        " or the stream came back to this server"
    )
    if top.epoch >= MAX_EPOCH:
        raise PermanentError(
            f"the stream {dest} changed source {MAX_EPOCH} times: no epoch left",
            hint="start a new stream (another producer.topic) and re-snapshot into it",
        )
    return SourceRecord(top.epoch + 1, now.system, now.timeline, 0, slot), reason


def destination(settings: Pg2KafkaSettings) -> str:
    """Where a stream's events go, as sinks see it: what its epochs are ordered within."""
    p = settings.producer
    if output_format(settings).connect_records:
        return f"debezium:{settings.debezium.topic_prefix}"
    return p.topic_template or p.topic


def record_key(dest: str, database: str, slot: str, system: str) -> bytes:
    """The key of one pipeline's record: a JSON array (a topic name cannot start with
    ``[``, so the records of walcast before 0.x — keyed by the bare destination — are told
    apart and still read)."""
    return orjson.dumps([dest, database, slot, system])


class SourceLedger:
    """The stream's :class:`SourceRecord` in Kafka. Used by the leader only: one writer
    per record. :meth:`start` decides the epoch; :meth:`commit` records a new one (acked
    before any event of it is sent); :meth:`advance` records progress, asynchronously."""

    def __init__(self, settings: Pg2KafkaSettings) -> None:
        self.settings = settings
        self.topic = settings.producer.source_topic
        self.destination = destination(settings)
        self._legacy_key = self.destination.encode()
        # This pipeline's record; its system identifier is known from start().
        self.key = self._legacy_key
        self.config = settings.kafka.client_config()
        self.current: SourceRecord | None = None
        self._producer: Producer | None = None
        self._failure: KafkaError | None = None
        self._last_write = 0.0

    def start(self, now: Identity) -> tuple[SourceRecord, str | None]:
        """The record to stream under, and why it is a new epoch (None: it is not). A
        stream without a record starts at epoch 0 (what events without ``epoch`` carry),
        recorded at once. A new epoch is not recorded yet: the caller first asks for the
        snapshots, then :meth:`commit` s it — a crash between the two finds the source
        changed again, and asks again."""
        check_lsn_range(now)
        slot = self.settings.replication.slot
        self.key = record_key(self.destination, self.settings.postgres.database, slot,
                              now.system)  # fmt: skip
        records = self.read_all()
        record, reason = decide(records, self.key, now, slot, self.destination)
        if not records:
            log.info(
                "no record of stream %s in %s: a new stream, at epoch 0 (a record deleted"
                " by hand would hide a change of source from the next start)",
                self.destination, self.topic,
            )  # fmt: skip
        if reason is None:
            if records.get(self.key) != record:
                self.commit(record)
            self.current = record
        return record, reason

    def read(self) -> SourceRecord | None:
        """The destination's newest record (highest epoch), or None."""
        records = self.read_all()
        return max(records.values(), key=lambda r: r.epoch) if records else None

    def read_all(self) -> dict[bytes, SourceRecord]:
        """Every record of the destination by key: the compacted topic read to its end."""
        created = ensure_topic(
            self.config,
            self.topic,
            1,
            self.settings.producer.topic_replication_factor,
            # Compacted: one record per stream survives. Segments roll hourly so that
            # compaction keeps what a start-up reads small.
            {"cleanup.policy": "compact", "segment.ms": "3600000"},
        )
        consumer = Consumer(
            {
                **self.config,
                "group.id": "walcast-source-ledger",  # never committed: assigned, not joined
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        try:
            deadline = time.monotonic() + READ_TIMEOUT_S
            while True:  # a topic just created is known to every broker a moment later
                meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
                if meta.error is None or not created or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if meta.error is not None:
                raise RetriableError(f"topic {self.topic}: {meta.error}")
            ends: dict[int, int] = {}
            start = []
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=10
                )
                if high > low:
                    ends[p] = high
                    start.append(TopicPartition(self.topic, p, low))
            found: dict[bytes, bytes] = {}
            if start:
                consumer.assign(start)
            while ends:
                if time.monotonic() > deadline:
                    raise RetriableError(
                        f"could not read {self.topic} to its end within {READ_TIMEOUT_S:.0f}s"
                    )
                msg = consumer.poll(1.0)
                if msg is None:
                    continue
                err = msg.error()
                partition = msg.partition()
                assert partition is not None
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        ends.pop(partition, None)
                        continue
                    raise RetriableError(f"reading {self.topic}: {err}")
                key = msg.key()
                if key is not None and self._ours(key):
                    value = msg.value()
                    if value is None:
                        found.pop(key, None)  # a tombstone
                    else:
                        found[key] = value
                offset = msg.offset()
                if offset is not None and offset + 1 >= ends.get(partition, 0):
                    ends.pop(partition, None)
        except KafkaException as exc:
            raise RetriableError(f"reading {self.topic}: {exc}") from exc
        finally:
            consumer.close()
        records = {}
        for key, value in found.items():
            try:
                records[key] = SourceRecord.from_json(value)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise PermanentError(
                    f"a record of stream {self.destination} in {self.topic} is not walcast's"
                    f" ({type(exc).__name__}: {exc!r:.200})",
                    hint=f"nothing but pg2kafka writes to {self.topic}",
                ) from exc
        return records

    def _ours(self, key: bytes) -> bool:
        """A record of this destination: one pipeline's, or the older per-destination one."""
        if key == self._legacy_key:
            return True
        if not key.startswith(b"["):
            return False
        try:
            parts = orjson.loads(key)
        except orjson.JSONDecodeError:
            return False
        return isinstance(parts, list) and len(parts) == 4 and parts[0] == self.destination

    def commit(self, record: SourceRecord) -> None:
        """Record ``record`` and wait until Kafka acknowledged it."""
        self._send(record)
        producer = self._ensure_producer()
        left = producer.flush(30)
        if self._failure is not None or left:
            failure, self._failure = self._failure, None
            raise RetriableError(
                f"could not record the stream's source in {self.topic}: {failure or 'timed out'}"
            )
        self.current = record

    def advance(self, lsn: int) -> None:
        """The slot was confirmed up to ``lsn``: recorded at most once per status
        interval, without waiting (a lost record only narrows what the next start-up
        detects; it is written again with the next confirmation)."""
        current = self.current
        if current is None or lsn <= current.lsn:
            return
        now = time.monotonic()
        if now - self._last_write < self.settings.replication.status_interval_s:
            return
        record = replace(current, lsn=lsn)
        self._send(record)
        self.current = record
        assert self._producer is not None
        self._producer.poll(0)
        if self._failure is not None:
            log.warning("could not record the stream's position in %s: %s", self.topic,
                        self._failure)  # fmt: skip
            self._failure = None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

    def _send(self, record: SourceRecord) -> None:
        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                self._failure = err

        self._ensure_producer().produce(
            self.topic, record.to_json(), self.key, on_delivery=delivered
        )
        self._last_write = time.monotonic()

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {**self.config, "enable.idempotence": True, "acks": "all", "linger.ms": 0}
            )
        return self._producer


__all__ = [
    "SourceLedger",
    "SourceRecord",
    "check_lsn_range",
    "decide",
    "destination",
    "judge",
    "record_key",
]
