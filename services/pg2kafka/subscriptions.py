"""The subscription events stream, as an explicit state machine.

A stream (``_walcast.streams`` row) is in one of four states, read from its row:

* **LIVE** (``failover_checkpoint`` NULL): a session streams event inserts straight to
  the events topic (:class:`LiveEventsHandler`); the slot is confirmed after Kafka
  acknowledged (checkpoint last). Kafka silent for ``failover_after_s`` (or unreachable)
  writes the checkpoint — the slot position and time, only if none is set, so a second
  failure never overwrites the first — and the stream moves on.
* **QUEUEING** (checkpoint set, Kafka away): a session reads the slot from its confirmed
  position into ``_walcast.replay_queue`` (event ids in commit order), confirming after
  each queued transaction (:class:`QueueHandler`): WAL is released, the events stay in
  their table. It ends when a probe reaches Kafka.
* **REPLAYING** (checkpoint set, Kafka answers): the queue is read with COPY in seq order
  and sent; progress survives a restart; an empty queue clears the checkpoint and the
  stream is LIVE again from the slot, which continues exactly after the last queued event
  (:mod:`services.pg2kafka.replay`).
* **RECOVERING** (checkpoint marked ``recovering``, or the slot was invalidated by
  ``max_slot_wal_keep_size``): the slot is recreated and every undelivered event queued
  from the table, crash-safe (:func:`services.pg2kafka.replay.recover_slot`).

:func:`next_state` is the whole transition table: it depends only on the stored
checkpoint and on whether Kafka answers, so a restart in any state resumes correctly.

**Delivered snapshot.** While streaming (LIVE or QUEUEING), the stream stores a snapshot
once the slot's handled position passes it: every transaction visible in it was sent or
queued. Recovery rebuilds the queue from it (see :mod:`services.pg2kafka.replay`).

Delivery stays at least once: an event may be sent twice around a failover (same
``walcast-event-id`` header), never lost, and events keep commit order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, ClassVar

import psycopg
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from services.pg2kafka import pgoutput as pg
from services.pg2kafka import replay
from services.pg2kafka.event_records import (
    KafkaUnavailableError,
    event_message,
    fit,
    kafka_answers,
    too_large,
)
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.postgres import LeaderLock
from services.pg2kafka.replication import SlotInvalidatedError
from services.pg2kafka.session import HandlerContext, SlotStream
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.topics import StreamTarget
from services.pg2kafka.transforms import from_settings
from shared.errors import RetriableError

log = logging.getLogger(__name__)


class StreamState(StrEnum):
    LIVE = "live"
    QUEUEING = "queueing"
    REPLAYING = "replaying"
    RECOVERING = "recovering"


def next_state(checkpoint: Any, kafka_answers: Callable[[], bool]) -> StreamState:
    """Where a stream stands, from its stored failover checkpoint and Kafka's presence
    (asked only when it matters)."""
    if checkpoint is None:
        return StreamState.LIVE
    if isinstance(checkpoint, dict) and checkpoint.get("recovering"):
        return StreamState.RECOVERING
    return StreamState.REPLAYING if kafka_answers() else StreamState.QUEUEING


def _events_row(session: HandlerContext, msg: pg.Insert) -> dict[str, Any] | None:
    """The row of an insert into ``_walcast.events``; None for any other table."""
    rel = session.builder.relations.get(msg.relation_oid)
    if rel is None or (rel.schema, rel.table) != ("_walcast", "events"):
        return None
    return {c.name: v for c, v in zip(rel.columns, msg.new, strict=True)}


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


class _EventsHandler:
    """What both event sessions share: storing the delivered snapshot as the slot's
    handled position passes it. Updates, deletes, truncates and logical messages of the
    slot are not ours to send."""

    def __init__(self, settings: Pg2KafkaSettings) -> None:
        self.settings = settings
        self.transforms = from_settings(settings.transforms)
        self.watermark = SnapshotWatermark()
        self.next_snapshot = 0.0

    def housekeeping(self, session: HandlerContext) -> bool:
        sub = self.settings.subscriptions
        now = time.monotonic()
        if now >= self.next_snapshot:
            self.next_snapshot = now + sub.snapshot_interval_s
            self.watermark.offer(*session.catalog.snapshot_position())
        delivered = self.watermark.passed(session.confirmed_lsn)
        if delivered is not None:
            session.catalog.execute(
                "UPDATE _walcast.streams SET delivered_snapshot = %s::pg_snapshot,"
                " delivered_snapshot_at = now() WHERE id = %s",
                [delivered, sub.stream_id],
            )
        return False

    def while_waiting(self, session: HandlerContext) -> None:
        pass

    def close(self) -> None:
        pass


class LiveEventsHandler(_EventsHandler):
    """LIVE: the stream's event inserts to the events topic; Kafka silent for
    ``failover_after_s`` raises :class:`KafkaUnavailableError`."""

    def handle(self, session: HandlerContext, lsn: int, msg: pg.Decoded) -> None:
        if not isinstance(msg, pg.Insert):
            return
        row = _events_row(session, msg)
        if row is None:
            return
        sub = self.settings.subscriptions
        out = event_message(session.target.topic, row, sub.key_field, lsn, self.transforms)
        if out is None:
            log.warning("event %s has no payload; skipped", row.get("id"))
            return
        if fit(out, session.value_limit(out.topic)) is None:
            out = too_large(out, row, session.metrics)
        session.send(out, "event")

    def housekeeping(self, session: HandlerContext) -> bool:
        super().housekeeping(session)
        self.check_kafka(session)
        return False

    def while_waiting(self, session: HandlerContext) -> None:
        self.check_kafka(session)

    def check_kafka(self, session: HandlerContext) -> None:
        limit = self.settings.subscriptions.failover_after_s
        stalled = session.stalled_for()
        if stalled > limit:
            raise KafkaUnavailableError(f"no acknowledgement from Kafka for {stalled:.0f}s")


class QueueHandler(_EventsHandler):
    """QUEUEING: the stream's event ids into ``_walcast.replay_queue`` in commit order,
    durable before their transaction may be confirmed; the session ends (housekeeping
    returns True) once a probe reaches Kafka."""

    def __init__(self, settings: Pg2KafkaSettings, topic: str) -> None:
        super().__init__(settings)
        self.topic = topic
        self.pending: list[tuple[str, int]] = []
        self.queue_conn = psycopg.connect(settings.postgres.conninfo(), autocommit=True)
        self.next_probe = 0.0
        self.queued = 0
        self.probe = AdminClient({**settings.kafka.client_config(), "socket.timeout.ms": 1000})

    # Queue rows held for the open transaction before they are written: a transaction of
    # millions of events must not be held whole (the slot sends only committed
    # transactions, so writing a part early is safe; a crash before the commit is
    # confirmed writes that part again: at least once, as everywhere).
    MAX_PENDING = 10_000

    def handle(self, session: HandlerContext, lsn: int, msg: pg.Decoded) -> None:
        if isinstance(msg, pg.Insert):
            row = _events_row(session, msg)
            if row is not None:
                self.pending.append((str(row["created_at"]), int(str(row["id"]))))
                if len(self.pending) >= self.MAX_PENDING:
                    self.write_pending()
        elif isinstance(msg, pg.Commit) and self.pending:
            self.write_pending()

    def write_pending(self) -> None:
        with self.queue_conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
                " VALUES (%s, %s, %s)",
                [(self.settings.subscriptions.stream_id, c, i) for c, i in self.pending],
            )
        self.queued += len(self.pending)
        self.pending.clear()

    def housekeeping(self, session: HandlerContext) -> bool:
        super().housekeeping(session)
        now = time.monotonic()
        if now < self.next_probe:
            return False
        answers = kafka_answers(self.settings, self.topic, self.probe)
        self.next_probe = time.monotonic() + self.settings.subscriptions.probe_interval_s
        return answers

    def close(self) -> None:
        self.queue_conn.close()


class SubscriptionStream(SlotStream):
    """Runs one stream through its states (see the module doc) until stopped."""

    what = "stream the subscription events"

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        metrics: Metrics,
        stop: threading.Event,
        target: StreamTarget | None = None,
    ) -> None:
        super().__init__(
            settings, metrics, stop, target or StreamTarget.subscription_events(settings)
        )
        self.state: StreamState | None = None
        self.reason = ""  # why the slot needs recovering
        self.leader: LeaderLock | None = None  # held while run_once runs

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

    def kafka_answers(self) -> bool:
        return kafka_answers(self.settings, self.target.topic)

    def where(self) -> StreamState:
        return next_state(self.checkpoint(), self.kafka_answers)

    # -- the machine -------------------------------------------------------------------

    def run_once(self) -> None:
        """Lead the slot, then step through states until stopped; a failure is raised (the
        retry around it reconnects, and the next attempt starts from the stored state).

        The leader lock is held across every state, not per session: a replay or a
        recovery runs between sessions, and a second process must never replay the same
        queue, or go live while this one replays (duplicates, commit order broken)."""
        lock = self.lead()
        if lock is None:
            return  # stopped while standing by
        self.leader = lock
        try:
            self._steps()
        finally:
            self.leader = None
            self.step_down(lock)

    def _steps(self) -> None:
        state = self.where()
        while not self.stop.is_set():
            if self.leader is not None:
                self.leader.check(0)  # a lost lock: another process may lead by now
            if state != self.state:
                log.info(
                    "subscription stream %s: %s",
                    self.settings.subscriptions.stream_id,
                    state.value,
                    extra={"from": self.state.value if self.state else None},
                )
                self.state = state
            try:
                step = self.STEPS[state]
                nxt = step(self)
            except SlotInvalidatedError as exc:
                self.reason = str(exc)
                nxt = StreamState.RECOVERING
            if nxt is None:
                return  # stopped
            state = nxt

    def live_step(self) -> StreamState | None:
        """Stream live until stopped (None) or Kafka fails (checkpoint set, next state)."""
        try:
            self.session(self.leader).run(LiveEventsHandler(self.settings))
            return None
        except (KafkaUnavailableError, KafkaException) as exc:
            self.set_checkpoint(str(exc))
        except RetriableError as exc:
            if self.kafka_answers():
                raise  # Postgres, not Kafka: reconnect
            self.set_checkpoint(str(exc))
        return self.where()

    def queue_step(self) -> StreamState | None:
        """Queue until Kafka answers (REPLAYING) or stopped (None)."""
        handler = QueueHandler(self.settings, self.target.topic)
        if self.session(self.leader).run(handler, needs_kafka=False):
            return StreamState.REPLAYING
        return None

    def replay_step(self) -> StreamState | None:
        """Send the queue; empty: LIVE. Kafka failing midway raises
        :class:`KafkaUnavailableError` (the retry backs off, then QUEUEING)."""
        if replay.replay_queue(self.settings, self.target, self.metrics, self.stop, self.live.tick):
            return StreamState.LIVE
        return None

    def recover_step(self) -> StreamState | None:
        reason = self.reason or "a previous recovery did not finish"
        replay.recover_slot(self.settings, self.target, self.metrics, self.stop, self.live.tick,
                            reason, self.leader)  # fmt: skip
        self.reason = ""
        if self.stop.is_set():
            return None
        return self.where()

    # One step per state; each returns the next state, or None when stopped.
    STEPS: ClassVar[Mapping[StreamState, Callable[[SubscriptionStream], StreamState | None]]] = {
        StreamState.LIVE: live_step,
        StreamState.QUEUEING: queue_step,
        StreamState.REPLAYING: replay_step,
        StreamState.RECOVERING: recover_step,
    }
