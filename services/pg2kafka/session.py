"""One replication session: a slot streamed into Kafka by a handler, checkpoint last.

:class:`ReplicationSession` owns everything one connected run needs — the replication
source, the Kafka sink with its memory guard, the :class:`AckTracker`, the leader lock,
the catalog connection, heartbeats and the event builder — and knows nothing of who runs
it: the caller passes settings, the slot to stream (:class:`StreamTarget`), its metrics,
the stop event, a :class:`Liveness` to keep current and a :class:`Handler` that decides
what each message becomes.

The loop, on one thread:

1. poll the replication stream (unless the memory guard is full: then only serve Kafka
   acks and standby status updates — backpressure);
2. keep the transaction bookkeeping (Begin / Commit, relations, types) and hand every
   other message to the handler, which sends what it produces through :meth:`send`,
   tagged with its transaction;
3. serve delivery callbacks; the :class:`AckTracker` moves the confirmable LSN only past
   transactions Kafka fully acknowledged, in commit order;
4. report that LSN to Postgres as flushed (checkpoint last).

A crash at any point leaves the slot at a transaction boundary whose messages are all in
Kafka; the restart redelivers the unconfirmed tail (same LSNs, detectable duplicates).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import AckTracker, EventBuilder
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.output import output_format
from services.pg2kafka.postgres import Catalog, Heartbeat, LeaderLock, wait_for_slot
from services.pg2kafka.replication import PostgresReplicationSource
from services.pg2kafka.settings import Pg2KafkaSettings, inserts_publication
from services.pg2kafka.topics import StreamTarget, Topics, producer_config
from services.pg2kafka.transforms import from_settings
from services.pg2kafka.types import TypeRegistry
from shared.errors import PermanentError
from shared.kafka import KafkaSink, Outgoing
from shared.logs import SampledLog
from shared.retry import call_with_retry

log = logging.getLogger(__name__)

BATCH_MAX = 2000  # replication messages handled between two housekeeping rounds


@dataclass
class Liveness:
    """What the ops endpoint reads of a stream: the loop's last round (``/health``),
    whether it streams (``/ready``), and whether it confirmed something since the last
    failure (a retry that progressed starts its backoff over)."""

    last_loop: float = field(default_factory=time.monotonic)
    streaming: bool = False
    progressed: bool = False
    # Holds the slot's leader lock (snapshotting, starting a session, or streaming).
    leading: bool = False
    # The leader reads the initial snapshot (before streaming).
    snapshotting: bool = False
    # When a round last found another process leading (monotonic; 0: never).
    standby_at: float = 0.0

    def tick(self) -> None:
        self.last_loop = time.monotonic()

    def standing_by(self) -> None:
        self.standby_at = time.monotonic()

    def standby(self, within_s: float) -> bool:
        """A standby whose last round was within ``within_s``: connected and waiting."""
        return not self.leading and time.monotonic() - self.standby_at < within_s

    def take_progress(self) -> bool:
        made, self.progressed = self.progressed, False
        return made


class HandlerContext(Protocol):
    """What a handler may do with the session it runs in: build events, emit records as
    part of the open transaction, ask Kafka about a topic, read the catalog, and see
    what Kafka acknowledged — not move the position itself. The session confirms an LSN
    to Postgres only past transactions Kafka fully acknowledged (checkpoint last), and
    no handler can reach past this protocol to change that (mypy holds handlers to it)."""

    @property
    def builder(self) -> EventBuilder:
        """The session's event builder (relations, types, the open transaction)."""
        ...

    @property
    def catalog(self) -> Catalog:
        """The session's catalog connection (not the replication connection)."""
        ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def target(self) -> StreamTarget:
        """The slot streamed and where its records go."""
        ...

    @property
    def confirmed_lsn(self) -> int:
        """The position last confirmed to Postgres (every record below it acknowledged)."""
        ...

    @property
    def transaction(self) -> int:
        """The open transaction's sequence number (what :meth:`acknowledged` takes)."""
        ...

    def acknowledged(self, transaction: int) -> bool:
        """Whether Kafka acknowledged every record of that transaction."""
        ...

    def stalled_for(self) -> float:
        """Seconds Kafka has acknowledged nothing while records wait (0: flowing)."""
        ...

    def send(self, out: Outgoing, op: str) -> None:
        """One record, part of the open transaction, counted as ``op``."""
        ...

    def write(self, out: Outgoing) -> None:
        """One record, part of the open transaction, uncounted (see :meth:`count`)."""
        ...

    def count(self, op: str, nbytes: int) -> None:
        """Count one ``op`` of ``nbytes`` (a record written to several partitions)."""
        ...

    def ensure_topic(self, topic: str) -> int:
        """The topic's partition count (created when configured to)."""
        ...

    def value_limit(self, topic: str) -> int:
        """The largest record (key and value) ``topic`` takes."""
        ...

    def refresh_partitions(self, topic: str) -> int:
        """The partition count, asked again (partitions may have been added)."""
        ...


class Handler(Protocol):
    """What a session's messages become.

    ``handle`` gets every message but Relation and Type (the session caches those), in
    stream order: a Commit after its transaction's changes and *before* the session
    closes the transaction, so a handler can make the transaction's work durable before
    its end may be confirmed. ``housekeeping`` runs once per batch and returns True to
    end the session (its work is done); ``while_waiting`` runs while a send waits for
    Kafka. Any of them may raise: the session ends, nothing unacknowledged is confirmed.
    """

    def handle(self, session: HandlerContext, lsn: int, msg: pg.Decoded) -> None: ...

    def housekeeping(self, session: HandlerContext) -> bool: ...

    def while_waiting(self, session: HandlerContext) -> None: ...

    def close(self) -> None: ...


class ReplicationSession:
    """Everything one connected run creates; :meth:`run` streams until stopped, until the
    handler ends it, or until a failure (raised). Resources are released either way."""

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        target: StreamTarget,
        metrics: Metrics,
        stop: threading.Event,
        live: Liveness,
        leader: LeaderLock | None = None,
    ) -> None:
        s = self.settings = settings
        conninfo = s.postgres.conninfo()
        self.target = target
        self.metrics = metrics
        metrics.inflight_limit.set(settings.producer.max_inflight_bytes)
        self.stop = stop
        self.live = live
        self.handler: Handler | None = None
        self.source = PostgresReplicationSource(
            conninfo,
            target.slot,
            target.publication,
            status_interval_s=s.replication.status_interval_s,
            wal_sender_timeout_s=s.replication.wal_sender_timeout_s,
            invalid_text=s.replication.invalid_text,
            extra_options=output_format(s).session_options,
            # The CDC slot also streams the insert-only publication (tables without a
            # key, filters.keyless_tables=inserts) when init created it.
            optional_publications=(
                (inserts_publication(target.publication),)
                if target.slot == s.replication.slot
                and target.publication == s.replication.publication
                else ()
            ),
        )
        self.sink = KafkaSink(
            producer_config(s),
            max_inflight_bytes=s.producer.max_inflight_bytes,
            while_waiting=self.while_waiting,
        )
        self.tracker = AckTracker()
        self.sink.set_listener(self.tracker.acked)
        # A stream that must lead across sessions (the subscription stream's replay runs
        # between them) passes the lock it holds; the session then neither takes nor
        # releases it (advisory locks are re-entrant on their connection).
        self.owns_leader = leader is None
        self.leader = leader or LeaderLock(conninfo, target.slot)
        self.catalog = Catalog(conninfo)
        self.heartbeat = Heartbeat(self.catalog, s.replication.heartbeat_interval_s)
        self.builder = EventBuilder(
            s.postgres.database,
            TypeRegistry(self.catalog.type_info),
            no_identity=s.replication.no_identity,
            primary_key=self.catalog.primary_key,
            scrub_secrets=s.ddl.scrub_secrets,
            transforms=from_settings(s.transforms),
        )
        self.topics = Topics(s, self.sink)
        self.seq = 0  # the open transaction's tracker sequence
        self.commit_times: deque[tuple[int, float]] = deque()
        self._undecodable_log = SampledLog(log, "undecodable text reports")
        self.op_counts: dict[str, int] = {}
        self.bytes_out = 0

    # -- running -----------------------------------------------------------------------

    def run(self, handler: Handler, *, needs_kafka: bool = True) -> bool:
        """Stream into ``handler``. True: the handler ended the session; False: stopped
        (or stopped while waiting to lead). ``needs_kafka``: check the topic first (fail
        fast on a missing one); a session that must run while Kafka is away passes False."""
        self.handler = handler
        s = self.settings
        try:
            # One topic to check: not under a template, nor in the Debezium format
            # (a topic per table, created or checked at each table's first change).
            per_table = output_format(s).per_table_topics and self.target.topic == s.producer.topic
            if needs_kafka and self.target.topic_template is None and not per_table:
                self.ensure_topic(self.target.topic)
            if not self.leader.acquire(self.stop, s.replication.standby_poll_s, self.live.tick):
                return False
            wait_for_slot(self.catalog, self.target.slot, s.replication, self.stop, self.live.tick)
            self.source.start()
            self.live.streaming = True
            ended = False
            while not self.stop.is_set():
                self.live.tick()
                self.housekeeping()
                if handler.housekeeping(self):
                    ended = True
                    break
                batch = self.source.poll_batch(BATCH_MAX, 0.2)
                for lsn, msg in batch:
                    self.dispatch(handler, lsn, msg)
                if batch:
                    self.metrics.batch.observe(len(batch))
            # Orderly end: what is in flight gets its acks, then the final position.
            self.sink.flush(30)
            self.housekeeping()
            self.source.send_status()
            return ended
        except PermanentError:
            # A deliberate stop (a rule a DDL made void, a record Kafka refuses): the
            # transactions before the one that stopped are confirmed once acknowledged, so
            # a restart begins at that transaction, not before (which could send rows
            # again under the shape the stop protects). The open one is never confirmed.
            try:
                self.sink.flush(30)
                self.housekeeping()
                self.source.send_status()
            except Exception:  # noqa: BLE001 - the stop's own reason is what is raised
                log.warning("could not confirm the acknowledged position before stopping")
            raise
        finally:
            self.live.streaming = False
            self.close()

    def dispatch(self, handler: Handler, lsn: int, msg: pg.Decoded) -> None:
        """The transaction bookkeeping around the handler (see :class:`Handler`). Row
        changes, nearly every message, are tested for first: this runs per message."""
        cls = msg.__class__
        if cls is pg.Insert or cls is pg.Update or cls is pg.Delete:
            handler.handle(self, lsn, msg)
        elif cls is pg.Begin:
            assert isinstance(msg, pg.Begin)
            self.seq = self.builder.begin(msg).seq
            self.tracker.open(self.seq)
        elif cls is pg.Commit:
            assert isinstance(msg, pg.Commit)
            handler.handle(self, lsn, msg)
            self.builder.commit(msg)
            self.commit_times.append((self.seq, msg.commit_ts_us / 1e6))
            self.tracker.close(self.seq, msg.end_lsn)
        elif cls is pg.Relation:
            assert isinstance(msg, pg.Relation)
            self.builder.relation(msg)
        elif cls is pg.TypeMessage:
            assert isinstance(msg, pg.TypeMessage)
            self.builder.type_message(msg)
        else:
            handler.handle(self, lsn, msg)

    def send(self, out: Outgoing, op: str) -> None:
        """Hand one record to Kafka as part of the open transaction, counted as ``op``.
        (Per event: :meth:`write` and :meth:`count` inlined.)"""
        seq = self.seq
        self.tracker.sent(seq)
        self.sink.write(out, seq)
        counts = self.op_counts
        counts[op] = counts.get(op, 0) + 1
        self.bytes_out += len(out.value or b"")

    def write(self, out: Outgoing) -> None:
        """Hand a record to Kafka as part of the open transaction, uncounted (a record
        written to several partitions counts once: :meth:`count`)."""
        self.tracker.sent(self.seq)
        self.sink.write(out, self.seq)

    def count(self, op: str, nbytes: int) -> None:
        self.op_counts[op] = self.op_counts.get(op, 0) + 1
        self.bytes_out += nbytes

    @property
    def confirmed_lsn(self) -> int:
        return self.source.confirmed_lsn

    @property
    def transaction(self) -> int:
        return self.seq

    def acknowledged(self, transaction: int) -> bool:
        return self.tracker.is_done(transaction)

    def stalled_for(self) -> float:
        return self.sink.stalled_for()

    def ensure_topic(self, topic: str) -> int:
        """The topic's partition count (see :class:`Topics`)."""
        return self.topics.ensure(topic)

    def value_limit(self, topic: str) -> int:
        """The largest event value ``topic`` takes."""
        return self.topics.value_limit(topic)

    def refresh_partitions(self, topic: str) -> int:
        """Ask Kafka again (partitions may have been added since start)."""
        return self.topics.refresh(topic)

    def while_waiting(self) -> None:
        """Runs while a write waits for Kafka (memory guard full, or librdkafka's queue):
        acks that arrive still confirm, the status keeps Postgres' connection alive, the
        liveness check sees a waiting loop, not a dead one."""
        self.live.tick()
        self.source.confirm(self.tracker.confirmed)
        self.source.maybe_send_status()
        self.leader.check(self.settings.replication.standby_poll_s * 5)
        if self.handler is not None:
            self.handler.while_waiting(self)

    def housekeeping(self) -> None:
        """Once per batch: serve acks, confirm what is safe, heartbeat, export metrics."""
        tracker, source = self.tracker, self.source
        before = source.confirmed_lsn
        self.sink.poll(0)  # delivery callbacks move tracker.confirmed
        if tracker.idle():
            # Nothing in flight: everything the server sent is in Kafka, including what it
            # skipped (other databases, filtered or empty transactions).
            tracker.advance_idle(max(source.received_lsn, source.keepalive_lsn))
            self.heartbeat.maybe_beat()
        if tracker.confirmed > before:
            source.confirm(tracker.confirmed)
            self.live.progressed = True
            now = time.time()
            while self.commit_times and tracker.is_done(self.commit_times[0][0]):
                _, committed = self.commit_times.popleft()
                self.metrics.commit_to_ack.observe(max(0.0, now - committed))
                self.metrics.transactions.inc()
        source.maybe_send_status()
        self.leader.check(self.settings.replication.standby_poll_s * 5)
        self._export_metrics()

    def _export_metrics(self) -> None:
        m, b, source = self.metrics, self.builder, self.source
        for op, n in self.op_counts.items():
            m.events.labels(op).inc(n)
        self.op_counts.clear()
        if self.bytes_out:
            m.bytes.inc(self.bytes_out)
            self.bytes_out = 0
        if self.sink.waits:
            m.backpressure.inc(self.sink.waits)
            self.sink.waits = 0
        if b.unconverted:
            m.unconverted.inc(b.unconverted)
            b.unconverted = 0
        if b.malformed_ddl:
            m.malformed.inc(b.malformed_ddl)
            b.malformed_ddl = 0
        if b.skipped_no_identity:
            m.skipped.inc(b.skipped_no_identity)
            b.skipped_no_identity = 0
        text = pg.TEXT
        if text.undecodable:
            taken, text.undecodable = text.undecodable, 0
            m.undecodable.inc(taken)
            self._undecodable_log.warning(
                "text", "%d values were not UTF-8: decoded as %s", taken, text.codec
            )
        m.inflight.set(self.sink.inflight_bytes)
        retained = self.leader.retained_wal_bytes
        m.retained_wal.set(math.nan if retained is None else retained)
        m.confirmed.set(source.confirmed_lsn)
        m.lag.set(max(0, source.server_wal_end - source.confirmed_lsn))

    def close(self) -> None:
        try:
            if self.handler is not None:
                self.handler.close()
        finally:
            self.source.close()
            self.sink.close()
            self.catalog.close()
            if self.owns_leader:
                self.leader.release()


class SlotStream(ABC):
    """Sessions of one slot, one after another, until stopped: what the CDC stream and
    the subscription events stream share. ``run_once`` (the subclass's) runs until
    stopped or raises; ``run`` reconnects with the configured backoff, starting it over
    when the failed attempt had confirmed something."""

    what = "stream the replication slot"

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        metrics: Metrics,
        stop: threading.Event,
        target: StreamTarget,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.stop = stop
        self.target = target
        self.live = Liveness()

    def session(self, leader: LeaderLock | None = None) -> ReplicationSession:
        return ReplicationSession(
            self.settings, self.target, self.metrics, self.stop, self.live, leader
        )

    def lead(self) -> LeaderLock | None:
        """Stand by until this process leads the slot; the lock (``live.leading`` set), or
        None when stopped. Pair with :meth:`step_down`."""
        lock = LeaderLock(self.settings.postgres.conninfo(), self.target.slot)
        poll = self.settings.replication.standby_poll_s
        if lock.acquire(self.stop, poll, self.live.tick, self.live.standing_by):
            self.live.leading = True
            return lock
        lock.release()
        return None

    def step_down(self, lock: LeaderLock) -> None:
        """Leadership over (stopped or failed): the lock released, and nothing exported as
        this process's view of the slot any more."""
        self.live.leading = False
        self.metrics.retained_wal.set(math.nan)
        lock.release()

    def leader_tick(self, lock: LeaderLock) -> Callable[[], None]:
        """``live.tick`` for work outside a session (the initial snapshot), also keeping
        the slot's retained WAL current."""
        every = self.settings.replication.standby_poll_s * 5

        def tick() -> None:
            self.live.tick()
            lock.read_retained(every)
            retained = lock.retained_wal_bytes
            self.metrics.retained_wal.set(math.nan if retained is None else retained)

        return tick

    @abstractmethod
    def run_once(self) -> None:
        """Run until stopped; raise on a failure (``run`` decides whether to retry)."""

    def run(self) -> None:
        call_with_retry(
            self.run_once,
            policy=self.settings.retry,
            what=self.what,
            sleep=self.stop.wait,
            progressed=self.live.take_progress,
        )
