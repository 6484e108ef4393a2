"""The subscription events stream, and its failover when Kafka is unavailable.

States of one stream (``_walcast.streams`` row):

* **live** (``failover_checkpoint`` NULL): the slot streams event inserts straight to the
  events topic; the slot is confirmed after Kafka acknowledged (checkpoint last).
* **failover** (``failover_checkpoint`` set): entered when events wait longer than
  ``failover_after_s`` without an acknowledgement, or Kafka cannot be reached at start.
  The checkpoint (the slot position and time) is written only if none is set, so a
  second failure never overwrites the first. The slot is then read from its confirmed
  position into ``_walcast.replay_queue`` (event ids in commit order), confirming after
  each queued transaction: WAL is released, the events stay in their table.
* **replay**: once a probe reaches Kafka, the queue is read with COPY in seq order and
  sent; ``replay_position`` is stored after each acknowledged batch and the batch leaves
  the queue, so a restart resumes where the replay stopped. An empty queue clears the
  checkpoint and the stream goes live again from the slot, which continues exactly after
  the last queued event.

**Invalidated slot** (``max_slot_wal_keep_size``): the WAL after the slot's position is
gone, so the table must say what is undelivered. While streaming (live or queueing), the
stream stores a *delivered snapshot* once the slot's handled position passes it: every
transaction visible in it was sent or queued. Recovery (under the leader lock, marked in
the checkpoint so a crash midway redoes it) drops the slot, creates it again exporting a
snapshot, and in that snapshot rebuilds the queue from the queued events plus every event
whose ``xid`` the delivered snapshot does not see, in event id order; the new slot streams
exactly what that snapshot does not see. Id order is commit order for events of one row:
the generated triggers are deferred, so they draw ids while committing, and a second
writer of the row waits on the first one's row lock until it committed.

Delivery stays at least once: an event may be sent twice around a failover (same
``walcast-event-id`` header), never lost, and events keep commit order.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from psycopg import sql

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.app import LeaderLock, Pipeline, _Stream
from services.pg2kafka.replication import SlotInvalidatedError, created_slot_snapshot
from shared.errors import RetriableError
from shared.kafka import KafkaSink, Outgoing

log = logging.getLogger(__name__)


class KafkaUnavailableError(RetriableError):
    """Kafka has not acknowledged anything for ``failover_after_s`` (or cannot be reached)."""


def event_message(
    topic: str, row: dict[str, Any], key_field: str | None, lsn: int | None
) -> Outgoing | None:
    """The Kafka record for one events row: value = payload, key, metadata headers."""
    payload = row.get("payload")
    if not isinstance(payload, str):
        return None
    headers: list[tuple[str, bytes]] = [
        ("walcast-event-id", str(row.get("id")).encode()),
        ("walcast-stream-id", str(row.get("stream_id")).encode()),
        ("walcast-created-at", str(row.get("created_at")).encode()),
    ]
    if lsn is not None:
        headers.append(("walcast-lsn", str(lsn).encode()))
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        meta = orjson.loads(metadata)
        if isinstance(meta, dict):
            for k, v in meta.items():
                headers.append((str(k), v.encode() if isinstance(v, str) else orjson.dumps(v)))
    return Outgoing(topic, event_key(payload, key_field), payload.encode(), headers)


def event_key(payload: str, key_field: str | None) -> bytes | None:
    doc = orjson.loads(payload)
    if not isinstance(doc, dict):
        return None
    if key_field:
        node: Any = doc
        for part in key_field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return (node if isinstance(node, str) else orjson.dumps(node).decode()).encode()
    name = doc.get("tg_name")
    return name.encode() if isinstance(name, str) else None


def _is_events(rel: pg.Relation | None) -> bool:
    return rel is not None and (rel.schema, rel.table) == ("_walcast", "events")


class SnapshotWatermark:
    """Delivered-snapshot candidates waiting for the handled position to pass them.

    A candidate is (snapshot, lsn) with ``lsn`` read after the snapshot was taken, so every
    transaction visible in the snapshot committed before ``lsn``. Once the slot's handled
    (acknowledged or queued) position reaches ``lsn``, the snapshot is a delivered one.
    Offers come in increasing lsn order. Past ``limit`` waiting candidates the newest is
    replaced: the stored snapshot may then trail a little more, never run ahead.
    """

    def __init__(self, limit: int = 64) -> None:
        self.candidates: deque[tuple[str, int]] = deque()
        self.limit = limit

    def offer(self, snapshot: str, lsn: int) -> None:
        if len(self.candidates) >= self.limit:
            self.candidates.pop()
        self.candidates.append((snapshot, lsn))

    def passed(self, handled_lsn: int) -> str | None:
        """The newest candidate the handled position has passed (each is returned once)."""
        newest = None
        while self.candidates and self.candidates[0][1] <= handled_lsn:
            newest = self.candidates.popleft()[0]
        return newest


class _EventsStream(_Stream):
    """What both event sessions share: storing the delivered snapshot as the slot's handled
    position passes it (see the module doc, *Invalidated slot*)."""

    def __init__(self, pipeline: Pipeline, conninfo: str) -> None:
        super().__init__(pipeline, conninfo)
        self.watermark = SnapshotWatermark()
        self.next_snapshot = 0.0

    def housekeeping(self) -> None:
        super().housekeeping()
        sub = self.p.settings.subscriptions
        now = time.monotonic()
        if now >= self.next_snapshot:
            self.next_snapshot = now + sub.snapshot_interval_s
            self.watermark.offer(*self.catalog.snapshot_position())
        delivered = self.watermark.passed(self.source.confirmed_lsn)
        if delivered is not None:
            self.catalog.execute(
                "UPDATE _walcast.streams SET delivered_snapshot = %s::pg_snapshot,"
                " delivered_snapshot_at = now() WHERE id = %s",
                [delivered, sub.stream_id],
            )


class SubscriptionEventsStream(_EventsStream):
    """Live: event inserts of this stream to the events topic; nothing else is sent."""

    def handle(self, lsn: int, msg: pg.Decoded) -> None:
        if isinstance(msg, pg.Insert):
            rel = self.builder.relations.get(msg.relation_oid)
            if _is_events(rel):
                assert rel is not None
                self.send_event(lsn, rel, msg.new)
            return
        if isinstance(msg, (pg.Update, pg.Delete, pg.Truncate, pg.Message)):
            return  # only inserts are published; DDL and heartbeats are not ours to send
        super().handle(lsn, msg)

    def send_event(self, lsn: int, rel: pg.Relation, values: tuple[pg.Value, ...]) -> None:
        row = {c.name: v for c, v in zip(rel.columns, values, strict=True)}
        out = event_message(self.topic, row, self.p.settings.subscriptions.key_field, lsn)
        if out is None:
            log.warning("event %s has no payload; skipped", row.get("id"))
            return
        self.tracker.sent(self.seq)
        self.sink.write(out, self.seq)
        self.op_counts["event"] = self.op_counts.get("event", 0) + 1
        self.bytes_out += len(out.value)

    def housekeeping(self) -> None:
        super().housekeeping()
        self.check_kafka()

    def while_waiting(self) -> None:
        super().while_waiting()
        self.check_kafka()

    def check_kafka(self) -> None:
        limit = self.p.settings.subscriptions.failover_after_s
        stalled = self.sink.stalled_for()
        if stalled > limit:
            raise KafkaUnavailableError(f"no acknowledgement from Kafka for {stalled:.0f}s")


class QueueStream(_EventsStream):
    """Failover: records the stream's events in _walcast.replay_queue in commit order and
    confirms the slot after each queued transaction; ends when Kafka answers again."""

    needs_kafka = False

    def __init__(self, pipeline: Pipeline, conninfo: str) -> None:
        super().__init__(pipeline, conninfo)
        self.pending: list[tuple[str, int]] = []
        self.queue_conn = psycopg.connect(conninfo, autocommit=True)
        self.next_probe = 0.0
        self.queued = 0
        self.probe = AdminClient(
            {**pipeline.settings.kafka.client_config(), "socket.timeout.ms": 1000}
        )

    def handle(self, lsn: int, msg: pg.Decoded) -> None:
        if isinstance(msg, pg.Insert):
            rel = self.builder.relations.get(msg.relation_oid)
            if _is_events(rel):
                assert rel is not None
                row = {c.name: v for c, v in zip(rel.columns, msg.new, strict=True)}
                self.pending.append((str(row["created_at"]), int(str(row["id"]))))
            return
        if isinstance(msg, pg.Commit) and self.pending:
            # Durable in the queue before the commit is confirmed to the slot.
            with self.queue_conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
                    " VALUES (%s, %s, %s)",
                    [(self.p.settings.subscriptions.stream_id, c, i) for c, i in self.pending],
                )
            self.queued += len(self.pending)
            self.pending.clear()
        if isinstance(msg, (pg.Update, pg.Delete, pg.Truncate, pg.Message)):
            return
        super().handle(lsn, msg)

    def housekeeping(self) -> None:
        super().housekeeping()
        now = time.monotonic()
        if now >= self.next_probe:
            answers = kafka_answers(self.p, self.probe)
            self.next_probe = time.monotonic() + self.p.settings.subscriptions.probe_interval_s
            if answers:
                raise KafkaBackError

    def close(self) -> None:
        super().close()
        self.queue_conn.close()


class KafkaBackError(Exception):
    """Control flow: the queue session ends because Kafka answers again."""


def kafka_answers(p: Pipeline, admin: AdminClient | None = None) -> bool:
    """A metadata request for the events topic within a second. Reuse ``admin``: a client
    created per probe takes seconds to tear down while the brokers are away."""
    admin = admin or AdminClient({**p.settings.kafka.client_config(), "socket.timeout.ms": 1000})
    try:
        md = admin.list_topics(p.target.topic, timeout=1)
    except KafkaException:
        return False
    meta = md.topics.get(p.target.topic)
    return meta is not None and meta.error is None and bool(md.brokers)


class SubscriptionPipeline(Pipeline):
    """Runs live, failover (queue) and replay sessions of one stream; see the module doc."""

    def sql(self, statement: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.settings.postgres.conninfo(), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def checkpoint(self) -> Any:
        rows = self.sql(
            "SELECT failover_checkpoint FROM _walcast.streams WHERE id = %s",
            [self.settings.subscriptions.stream_id],
        )
        return rows[0][0] if rows else None

    def set_checkpoint(self, reason: str) -> None:
        """First failure wins: an existing checkpoint is never overwritten."""
        rows = self.sql(
            "UPDATE _walcast.streams SET failover_checkpoint = jsonb_build_object("
            " 'slot_lsn', (SELECT confirmed_flush_lsn::text FROM pg_replication_slots"
            "              WHERE slot_name = %s),"
            " 'at', now(), 'reason', %s::text)"
            " WHERE id = %s AND failover_checkpoint IS NULL RETURNING failover_checkpoint",
            [self.target.slot, reason, self.settings.subscriptions.stream_id],
        )
        if rows:
            self.metrics.failovers.inc()
            log.warning(
                "subscription stream %s: Kafka unavailable, queueing events (%s)",
                self.settings.subscriptions.stream_id,
                reason,
            )

    def run_once(self) -> None:
        while not self.stop_event.is_set():
            try:
                checkpoint = self.checkpoint()
                if isinstance(checkpoint, dict) and checkpoint.get("recovering"):
                    self.recover_slot("a previous recovery did not finish")
                    continue
                if checkpoint is None and not self._live():
                    continue  # Kafka failed: the checkpoint is set now
                if self.stop_event.is_set():
                    return
                if not kafka_answers(self):
                    self.stream_cls = QueueStream
                    try:
                        super().run_once()  # until Kafka answers (KafkaBackError) or stop
                        return
                    except KafkaBackError:
                        pass
                self.replay()
            except SlotInvalidatedError as exc:
                self.recover_slot(str(exc))

    def recover_slot(self, reason: str) -> None:
        """Recreate an invalidated slot and queue every event it can no longer deliver.

        Crash-safe: the checkpoint is marked ``recovering`` before the slot is dropped and
        unmarked in the transaction that rebuilds the queue, so a recovery cut short is
        redone from the start at the next attempt. Runs as the slot's leader.
        """
        sub = self.settings.subscriptions
        conninfo = self.settings.postgres.conninfo()
        slot = self.target.slot
        lock = LeaderLock(conninfo, slot)
        if not lock.acquire(self.stop_event, self.settings.replication.standby_poll_s, self.tick):
            return
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                state = conn.execute(
                    "SELECT wal_status, active_pid FROM pg_catalog.pg_replication_slots"
                    " WHERE slot_name = %s",
                    [slot],
                ).fetchone()
                checkpoint = self.checkpoint()
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
                    conn.execute(
                        sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot))
                    )
                    queued = self._rebuild_queue(conn, point)
            self.metrics.slot_recoveries.inc()
            log.warning(
                "subscription stream %s: slot %s recreated at %s; %d events queued for replay",
                sub.stream_id,
                slot,
                point,
                queued,
            )
        finally:
            lock.release()

    def _rebuild_queue(self, conn: psycopg.Connection[Any], point: str) -> int:
        """In the new slot's snapshot: the queue becomes the queued events plus every event
        the delivered snapshot does not see, in id order; that snapshot is delivered now."""
        stream = self.settings.subscriptions.stream_id
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

    def _live(self) -> bool:
        """Stream live until stopped (True) or Kafka fails (checkpoint set, False)."""
        self.stream_cls = SubscriptionEventsStream
        try:
            super().run_once()
            return True
        except (KafkaUnavailableError, KafkaException) as exc:
            self.set_checkpoint(str(exc))
        except RetriableError as exc:
            if kafka_answers(self):
                raise
            self.set_checkpoint(str(exc))
        return False

    def replay(self) -> None:
        """Send the queue in seq order, batch by batch; progress survives a restart."""
        sub = self.settings.subscriptions
        s = self.settings
        sink = KafkaSink(
            {
                **s.kafka.client_config(),
                "linger.ms": s.producer.linger_ms,
                "compression.type": s.producer.compression,
                "message.timeout.ms": int(sub.failover_after_s * 1000),
                "message.max.bytes": s.producer.max_message_bytes,
            },
            max_inflight_bytes=s.producer.max_inflight_bytes,
            while_waiting=self.tick,
        )
        sink.set_listener(lambda _seq: None)
        total = 0
        started = time.monotonic()
        try:
            with psycopg.connect(s.postgres.conninfo(), autocommit=True) as conn:
                remaining = conn.execute(
                    "SELECT count(*) FROM _walcast.replay_queue WHERE stream_id = %s",
                    [sub.stream_id],
                ).fetchone()
                self.metrics.replay_remaining.set(int(str(remaining[0])) if remaining else 0)
                while not self.stop_event.is_set():
                    batch = self._replay_batch(conn, sink)
                    if batch == 0:
                        break
                    total += batch
                    self.metrics.replayed.inc(batch)
                    self.metrics.replay_remaining.dec(batch)
                    log.info(
                        "replayed %d events (%.0f/s)",
                        total,
                        total / max(time.monotonic() - started, 1e-6),
                    )
                if self.stop_event.is_set():
                    return
                # Queue empty: back to live from the slot, which continues after it.
                conn.execute(
                    "UPDATE _walcast.streams SET failover_checkpoint = NULL,"
                    " replay_position = NULL WHERE id = %s",
                    [sub.stream_id],
                )
                log.warning(
                    "subscription stream %s: replay done (%d events), live again",
                    sub.stream_id,
                    total,
                )
        finally:
            sink.close()

    def _replay_batch(self, conn: psycopg.Connection[Any], sink: KafkaSink) -> int:
        sub = self.settings.subscriptions
        rows: list[tuple[int, dict[str, Any]]] = []
        copy_sql = (
            "COPY (SELECT q.seq, e.id, e.payload::text, e.metadata::text, e.stream_id,"
            " e.created_at::text FROM _walcast.replay_queue q JOIN _walcast.events e"
            " ON e.created_at = q.event_created_at AND e.id = q.event_id"
            f" WHERE q.stream_id = {int(sub.stream_id)} ORDER BY q.seq"
            f" LIMIT {int(sub.replay_batch)}) TO STDOUT"
        )
        with conn.cursor() as cur, cur.copy(copy_sql) as copy:
            copy.set_types(["int8", "int8", "text", "text", "int8", "text"])
            for seq, eid, payload, metadata, stream_id, created in copy.rows():
                rows.append(
                    (
                        seq,
                        {
                            "id": eid,
                            "payload": payload,
                            "metadata": metadata,
                            "stream_id": stream_id,
                            "created_at": created,
                        },
                    )
                )
        last = conn.execute(
            "SELECT max(seq) FROM (SELECT seq FROM _walcast.replay_queue WHERE stream_id = %s"
            " ORDER BY seq LIMIT %s) q",
            [sub.stream_id, sub.replay_batch],
        ).fetchone()
        if not rows and (last is None or last[0] is None):
            return 0
        for _seq, row in rows:
            out = event_message(self.target.topic, row, sub.key_field, None)
            if out is not None:
                sink.write(out, 0)
        try:
            sink.flush(sub.failover_after_s)
        except RetriableError as exc:
            raise KafkaUnavailableError(f"replay interrupted: {exc}") from exc
        upto = int(last[0]) if last and last[0] is not None else rows[-1][0]
        # Acknowledged: remember the position, then let the batch go (one transaction).
        with conn.transaction():
            conn.execute(
                "UPDATE _walcast.streams SET replay_position = %s WHERE id = %s",
                [orjson.dumps({"seq": upto}).decode(), sub.stream_id],
            )
            conn.execute(
                "DELETE FROM _walcast.replay_queue WHERE stream_id = %s AND seq <= %s",
                [sub.stream_id, upto],
            )
        return max(len(rows), 1)
