"""REPLAYING and RECOVERING of a subscription stream (states: :mod:`.subscriptions`).

**Replay**: the queue (``_walcast.replay_queue``) is read with COPY in seq order, batch
by batch, and sent; once Kafka acknowledged a batch, ``replay_position`` is stored and
the batch leaves the queue in one transaction, so a restart resumes where the replay
stopped. An empty queue clears the failover checkpoint: the stream is live again.

**Recovery of an invalidated slot** (``max_slot_wal_keep_size``): the WAL after the
slot's position is gone, so the table must say what is undelivered. Under the leader
lock, the checkpoint is marked ``recovering`` before the slot is dropped (a crash midway
redoes the recovery), the slot is created again exporting a snapshot, and in that
snapshot the queue becomes the queued events plus every event whose ``xid`` the stored
delivered snapshot does not see, in event id order; the new slot streams exactly what
that snapshot does not see. Id order is commit order for events of one row: the
generated triggers are deferred, so they draw ids while committing, and a second writer
of the row waits on the first one's row lock until it committed.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg import sql

from services.pg2kafka.event_records import (
    KafkaUnavailableError,
    event_key,
    metadata_headers,
    too_large,
    transformed_payload,
)
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.postgres import LeaderLock
from services.pg2kafka.replication import created_slot_snapshot
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.topics import RECORD_OVERHEAD, StreamTarget
from services.pg2kafka.transforms import from_settings
from shared.errors import RetriableError
from shared.kafka import BulkKafkaSink, Outgoing, topic_max_message_bytes

log = logging.getLogger(__name__)


def replay_queue(
    settings: Pg2KafkaSettings,
    target: StreamTarget,
    metrics: Metrics,
    stop: threading.Event,
    tick: Callable[[], None],
) -> bool:
    """Send the queue in seq order, batch by batch; progress survives a restart. True: the
    queue is empty and the checkpoint cleared (live again); False: stopped. Kafka failing
    midway raises ``KafkaUnavailableError``."""
    sub = settings.subscriptions
    s = settings
    sink = BulkKafkaSink(
        {
            **s.kafka.client_config(),
            "linger.ms": s.producer.linger_ms,
            "compression.type": s.producer.compression,
            "message.timeout.ms": int(sub.failover_after_s * 1000),
            "message.max.bytes": s.producer.max_message_bytes,
        },
        max_inflight_bytes=s.producer.max_inflight_bytes,
        while_waiting=tick,
    )
    topic = target.topic
    topic_limit = topic_max_message_bytes(s.kafka.client_config(), topic)
    limit = min(s.producer.max_message_bytes, topic_limit or s.producer.max_message_bytes)
    limit -= RECORD_OVERHEAD
    query = replay_query(sub.stream_id, sub.replay_batch, sub.key_field)
    key_path = sub.key_field.split(".") if sub.key_field else []
    produce = sink.producer.produce
    # Payloads are rewritten by the transform rules; the key SQL computed from the
    # original is then computed again from the rewritten one.
    transforms = from_settings(s.transforms)
    headers_of = _MetadataHeaders()
    stream_header = ("walcast-stream-id", str(sub.stream_id).encode())
    total = 0
    started = time.monotonic()

    missing: list[int] = []

    def send_rows(rows: list[tuple[Any, ...]]) -> None:
        for seq, eid, payload, metadata, created, key_text, key_in_python in rows:
            # The hot loop: Postgres wrote the value and (nearly always) the key; a
            # record costs its headers and one produce call.
            if payload is None:
                if eid is None:
                    missing.append(seq)
                continue
            if transforms is not None:
                rewritten = transformed_payload(payload, transforms)
                key_in_python = key_in_python or rewritten is not payload
                payload = rewritten
            value = payload.encode()
            if key_in_python:
                key = event_key(payload, sub.key_field)
            else:
                key = None if key_text is None else key_text.encode()
            headers = [
                ("walcast-event-id", eid.encode()),
                stream_header,
                ("walcast-created-at", created.encode()),
                *headers_of(metadata),
            ]
            if len(value) + (len(key) if key else 0) > limit:
                row = {"id": int(eid), "stream_id": sub.stream_id, "created_at": created}
                big = too_large(Outgoing(topic, key, value, headers), row, metrics)
                value = big.value
            try:
                produce(topic, value, key, headers=headers)
            except BufferError:
                sink.write(topic, value, key, headers=headers)

    def acknowledge(conn: psycopg.Connection[Any], batch: _BatchEnd) -> None:
        """Once Kafka acknowledged the batch: store the position, then let it go."""
        if missing:
            # Maintenance keeps partitions the queue references (V007); a partition
            # dropped by hand takes its events with it. Said, counted, never silent.
            metrics.replay_missing.inc(len(missing))
            log.error(
                "replay: %d queued events are gone from _walcast.events (queue seq %d..%d):"
                " not delivered",
                len(missing),
                missing[0],
                missing[-1],
            )
            missing.clear()
        try:
            sink.flush(sub.failover_after_s)
        except RetriableError as exc:
            raise KafkaUnavailableError(f"replay interrupted: {exc}") from exc
        # Acknowledged: remember the position, then let the batch go (one transaction).
        after = batch.last_seq
        with conn.transaction():
            conn.execute(
                "UPDATE _walcast.streams SET replay_position = %s WHERE id = %s",
                [orjson.dumps({"seq": after}).decode(), sub.stream_id],
            )
            conn.execute(
                "DELETE FROM _walcast.replay_queue WHERE stream_id = %s AND seq <= %s",
                [sub.stream_id, after],
            )

    try:
        with psycopg.connect(s.postgres.conninfo(), autocommit=True) as conn:
            remaining = conn.execute(
                "SELECT count(*) FROM _walcast.replay_queue WHERE stream_id = %s",
                [sub.stream_id],
            ).fetchone()
            metrics.replay_remaining.set(int(str(remaining[0])) if remaining else 0)
            with _QueueReader(s.postgres.conninfo(), query, key_path) as reader:
                for rows, batch_done in reader:
                    send_rows(rows)
                    if not batch_done:
                        continue
                    acknowledge(conn, batch_done)
                    total += batch_done.rows
                    metrics.replayed.inc(batch_done.rows)
                    metrics.replay_remaining.dec(batch_done.rows)
                    log.info(
                        "replayed %d events (%.0f/s)",
                        total,
                        total / max(time.monotonic() - started, 1e-6),
                    )
                    if stop.is_set():
                        break
            if stop.is_set():
                return False
            # Queue empty: back to live from the slot, which continues after it. The
            # emptiness is checked again in the statement that clears the checkpoint: a
            # row queued after the last read must never be left behind.
            cleared = conn.execute(
                "UPDATE _walcast.streams SET failover_checkpoint = NULL,"
                " replay_position = NULL WHERE id = %s AND NOT EXISTS"
                " (SELECT 1 FROM _walcast.replay_queue WHERE stream_id = %s) RETURNING id",
                [sub.stream_id, sub.stream_id],
            ).fetchone()
            if cleared is None:
                raise RetriableError("events were queued during the replay: replaying again")
            log.warning(
                "subscription stream %s: replay done (%d events), live again",
                sub.stream_id,
                total,
            )
            return True
    finally:
        sink.close()


@dataclass(frozen=True, slots=True)
class _BatchEnd:
    last_seq: int
    rows: int


class _QueueReader:
    """Reads the replay queue on its own thread and connection, batch after batch, handing
    rows over in chunks while the caller produces the ones before: Postgres' work then
    overlaps Python's. Iterating yields ``(rows, batch_end)``: ``batch_end`` is set on a
    batch's last chunk (the caller flushes and stores the position there). Each batch
    reads on from the last seq read, so it never waits for the previous batch's delete.
    Memory: at most ``chunks`` chunks of at most ``chunk_rows`` rows or ``chunk_bytes``
    of payload wait (the caller's batch is in Kafka's queue, bounded by the producer)."""

    def __init__(
        self,
        conninfo: str,
        query: sql.Composed,
        key_path: list[str],
        *,
        chunk_rows: int = 2000,
        chunk_bytes: int = 4 << 20,
        chunks: int = 8,
    ) -> None:
        self.conninfo, self.query, self.key_path = conninfo, query, key_path
        self.chunk_rows, self.chunk_bytes = chunk_rows, chunk_bytes
        self.handoff: queue.Queue[
            tuple[list[tuple[Any, ...]], _BatchEnd | None] | BaseException | None
        ] = queue.Queue(chunks)
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, name="replay-reader", daemon=True)

    def __enter__(self) -> _QueueReader:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancelled.set()
        while self.thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self.handoff.get(timeout=0.1)  # unblock a waiting put

    def __iter__(self) -> Iterator[tuple[list[tuple[Any, ...]], _BatchEnd | None]]:
        while True:
            item = self.handoff.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _put(
        self, item: tuple[list[tuple[Any, ...]], _BatchEnd | None] | BaseException | None
    ) -> bool:
        while not self.cancelled.is_set():
            try:
                self.handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                after = 0
                while True:
                    read = self._batch(conn, after)
                    if read is None:  # cancelled
                        return
                    if read == after:
                        self._put(None)  # the queue is empty
                        return
                    after = read
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            self._put(exc)

    def _batch(self, conn: psycopg.Connection[Any], after: int) -> int | None:
        """Hand one batch over; its last seq (``after`` when it was empty), None when
        cancelled. The batch's last chunk carries its end (an empty chunk when the rows
        ended at a chunk boundary)."""
        chunk: list[tuple[Any, ...]] = []
        size = rows = 0
        last = after
        params = {"after": after, "path": self.key_path}
        with conn.cursor() as cur, cur.copy(self.query, params) as copy:
            copy.set_types(_COLUMN_TYPES)
            for row in copy.rows():
                chunk.append(row)
                last = row[0]
                rows += 1
                size += len(row[2] or "")
                if len(chunk) >= self.chunk_rows or size >= self.chunk_bytes:
                    if not self._put((chunk, None)):
                        conn.close()  # mid-COPY: only closing ends it quietly
                        return None
                    chunk, size = [], 0
        if rows == 0:
            return after
        return last if self._put((chunk, _BatchEnd(last, rows))) else None


_COLUMN_TYPES = ["int8", "text", "text", "text", "text", "text", "bool"]


def replay_query(stream_id: int, batch: int, key_field: str | None) -> sql.Composed:
    """COPY of the next ``batch`` queued events after seq ``%(after)s`` (``%(path)s``:
    ``key_field`` split at its dots), in seq order: seq, event
    id, payload, metadata, created_at, the record key, and whether Python must compute the
    key. Postgres writes the key when its bytes are sure to equal what the live path
    (:func:`~.event_records.event_key`) makes of the payload: a string at ``key_field``
    (its text), else the ``tg_name`` fallback. A key that is a number, boolean, object or
    array is JSON text whose spelling Postgres and orjson may write differently, so that
    row says ``true`` and Python computes it, as it does for every row when a part of
    ``key_field`` looks like an array index (``#>`` would index arrays; the live path does
    not). An event gone from ``_walcast.events`` comes with a null id."""
    payload = sql.SQL("e.payload")
    fallback = sql.SQL(
        "WHEN jsonb_typeof(e.payload -> 'tg_name') = 'string' THEN e.payload ->> 'tg_name'"
    )
    parts = key_field.split(".") if key_field else []
    if any(p.lstrip("-").isdigit() for p in parts):
        key: sql.Composable = sql.SQL("NULL::text, e.id IS NOT NULL")
    elif parts:
        node = sql.SQL("(e.payload #> %(path)s::text[])")
        key = sql.SQL(
            "CASE WHEN jsonb_typeof({p}) <> 'object' THEN NULL"
            " WHEN jsonb_typeof({n}) = 'string' THEN {n} #>> '{{}}'"
            " WHEN jsonb_typeof({n}) <> 'null' THEN NULL {f} END,"
            " coalesce(jsonb_typeof({p}) = 'object'"
            " AND jsonb_typeof({n}) NOT IN ('string', 'null'), false)"
        ).format(p=payload, n=node, f=fallback)
    else:
        key = sql.SQL("CASE {f} END, false").format(f=fallback)
    return sql.SQL(
        "COPY (SELECT q.seq, e.id, e.payload::text, e.metadata::text, e.created_at::text, {key}"
        " FROM _walcast.replay_queue q LEFT JOIN _walcast.events e"
        " ON e.created_at = q.event_created_at AND e.id = q.event_id"
        " WHERE q.stream_id = {stream} AND q.seq > %(after)s"
        " ORDER BY q.seq LIMIT {batch}) TO STDOUT"
    ).format(key=key, stream=sql.Literal(int(stream_id)), batch=sql.Literal(int(batch)))


class _MetadataHeaders:
    """The headers of an events row's metadata, by its text: metadata repeats from row to
    row (a subscription's constant), so each distinct text is parsed once."""

    def __init__(self, size: int = 1024) -> None:
        self.known: dict[str | None, list[tuple[str, bytes]]] = {}
        self.size = size

    def __call__(self, metadata: str | None) -> list[tuple[str, bytes]]:
        found = self.known.get(metadata)
        if found is None:
            if len(self.known) >= self.size:
                self.known.clear()
            found = self.known[metadata] = metadata_headers(metadata)
        return found


def recover_slot(
    settings: Pg2KafkaSettings,
    target: StreamTarget,
    metrics: Metrics,
    stop: threading.Event,
    tick: Callable[[], None],
    reason: str,
    leader: LeaderLock | None = None,
) -> None:
    """Recreate an invalidated slot and queue every event it can no longer deliver.

    Crash-safe: the checkpoint is marked ``recovering`` before the slot is dropped and
    unmarked in the transaction that rebuilds the queue, so a recovery cut short is
    redone from the start at the next attempt. Runs as the slot's leader.
    """
    sub = settings.subscriptions
    conninfo = settings.postgres.conninfo()
    slot = target.slot
    lock = leader or LeaderLock(conninfo, slot)
    if leader is None and not lock.acquire(stop, settings.replication.standby_poll_s, tick):
        return
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            state = conn.execute(
                "SELECT wal_status, active_pid FROM pg_catalog.pg_replication_slots"
                " WHERE slot_name = %s",
                [slot],
            ).fetchone()
            row = conn.execute(
                "SELECT failover_checkpoint FROM _walcast.streams WHERE id = %s",
                [sub.stream_id],
            ).fetchone()
            checkpoint = row[0] if row else None
            pending = isinstance(checkpoint, dict) and checkpoint.get("recovering")
            if not pending and state is not None and state[0] != "lost":
                return  # another pg2kafka recovered it meanwhile
            if state is not None and state[1] is not None:
                raise RetriableError(f"slot {slot!r} is still streamed by pid {state[1]}")
            log.warning(
                "subscription stream %s: slot %s unusable (%s); recreating it and"
                " queueing undelivered events from the events table",
                sub.stream_id,
                slot,
                reason,
            )
            conn.execute(
                "UPDATE _walcast.streams SET failover_checkpoint = coalesce("
                " failover_checkpoint, jsonb_build_object('at', now(), 'reason', %s::text))"
                " || '{\"recovering\": true}'::jsonb WHERE id = %s",
                [f"slot invalidated: {reason}", sub.stream_id],
            )
            if state is not None:
                conn.execute("SELECT pg_catalog.pg_drop_replication_slot(%s)", [slot])
        with (
            created_slot_snapshot(conninfo, slot) as (point, snapshot),
            psycopg.connect(conninfo) as conn,
        ):
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
                queued = _rebuild_queue(conn, sub.stream_id, point)
        metrics.slot_recoveries.inc()
        log.warning(
            "subscription stream %s: slot %s recreated at %s; %d events queued for replay",
            sub.stream_id,
            slot,
            point,
            queued,
        )
    finally:
        if leader is None:
            lock.release()


def _rebuild_queue(conn: psycopg.Connection[Any], stream: int, point: str) -> int:
    """In the new slot's snapshot: the queue becomes the queued events plus every event the
    delivered snapshot does not see, in id order; that snapshot is delivered now."""
    cur = conn.execute(
        "WITH queued AS ("
        "  DELETE FROM _walcast.replay_queue WHERE stream_id = %(s)s"
        "  RETURNING event_created_at AS created_at, event_id AS id"
        "), missed AS ("
        "  SELECT e.created_at, e.id FROM _walcast.events e"
        "  JOIN _walcast.streams st ON st.id = e.stream_id"
        "  WHERE e.stream_id = %(s)s AND (st.delivered_snapshot IS NULL"
        "    OR NOT pg_catalog.pg_visible_in_snapshot(e.xid, st.delivered_snapshot))"
        ")"
        " INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
        " SELECT %(s)s, created_at, id FROM (SELECT * FROM queued UNION SELECT * FROM missed) u"
        " ORDER BY id, created_at",
        {"s": stream},
    )
    queued = cur.rowcount
    conn.execute(
        "UPDATE _walcast.streams SET failover_checkpoint = (failover_checkpoint - 'recovering')"
        " || jsonb_build_object('slot_lsn', %s::text), replay_position = NULL,"
        " delivered_snapshot = pg_catalog.pg_current_snapshot(), delivered_snapshot_at = now()"
        " WHERE id = %s",
        [point, stream],
    )
    return queued
