"""pg2kafka wired together: ``build(settings)`` composes the service; ``Pipeline.run``
streams the slot into Kafka.

The loop, on one thread:

1. poll the replication stream (unless the memory guard is full: then only serve Kafka
   acks and standby status updates — backpressure);
2. decode, build events, hand them to the Kafka sink tagged with their transaction;
3. serve delivery callbacks; the :class:`AckTracker` moves the confirmable LSN only past
   transactions Kafka fully acknowledged, in commit order;
4. report that LSN to Postgres as flushed (checkpoint last).

A crash at any point leaves the slot at a transaction boundary whose messages are all in
Kafka; the restart redelivers the unconfirmed tail (same LSNs, detectable duplicates).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.admin import maintain_partitions
from services.pg2kafka.changes import AckTracker, EventBuilder
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.replication import (
    PostgresReplicationSource,
    replication_application_name,
)
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.types import TypeInfo, TypeRegistry
from shared.cli import stop_on_signals
from shared.contract.event import ChangeEvent as Event
from shared.contract.event import JsonEventSerializer
from shared.errors import PermanentError, RetriableError
from shared.http import OpsServer
from shared.kafka import KafkaSink, Outgoing, ensure_topic
from shared.retry import call_with_retry

log = logging.getLogger(__name__)

DDL_PREFIX = "walcast.ddl"


class Metrics:
    """One pipeline's metrics; ``prefix`` keeps two pipelines of a process apart."""

    def __init__(self, registry: CollectorRegistry, prefix: str = "walcast_pg2kafka") -> None:
        self.events = Counter(
            f"{prefix}_events", "change events produced", ["op"], registry=registry
        )
        self.bytes = Counter(f"{prefix}_bytes", "event bytes produced", registry=registry)
        self.transactions = Counter(
            f"{prefix}_transactions", "transactions fully acknowledged", registry=registry
        )
        self.skipped = Counter(
            f"{prefix}_skipped_no_identity",
            "changes skipped: table without replica identity",
            registry=registry,
        )
        self.replayed = Counter(
            f"{prefix}_replayed_events", "events sent from the replay queue", registry=registry
        )
        self.replay_remaining = Gauge(
            f"{prefix}_replay_remaining", "events waiting in the replay queue", registry=registry
        )
        self.failovers = Counter(
            f"{prefix}_failovers",
            "times the stream switched to queueing because Kafka was unavailable",
            registry=registry,
        )
        self.slot_recoveries = Counter(
            f"{prefix}_slot_recoveries",
            "invalidated slots recreated, undelivered events queued from the events table",
            registry=registry,
        )
        self.unconverted = Counter(
            f"{prefix}_unconverted_values",
            "column values sent as their text because conversion failed",
            registry=registry,
        )
        self.malformed = Counter(
            f"{prefix}_malformed_messages",
            "logical messages with the DDL prefix that were not valid DDL messages (skipped)",
            registry=registry,
        )
        self.inflight = Gauge(
            f"{prefix}_inflight_bytes",
            "bytes handed to Kafka, not yet acknowledged",
            registry=registry,
        )
        self.confirmed = Gauge(
            f"{prefix}_confirmed_lsn", "LSN confirmed to the slot", registry=registry
        )
        self.quarantined = Gauge(
            f"{prefix}_quarantined_events",
            "subscription events in _walcast.subscription_errors (failed at the application's"
            " commit, kept instead of failing it)",
            registry=registry,
        )
        self.lag = Gauge(
            f"{prefix}_replication_lag_bytes",
            "server WAL end minus confirmed LSN",
            registry=registry,
        )
        self.backpressure = Counter(
            f"{prefix}_backpressure_waits",
            "times reading paused because the memory guard was full",
            registry=registry,
        )
        self.batch = Histogram(
            f"{prefix}_batch_messages",
            "replication messages handled per loop batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2000),
            registry=registry,
        )
        self.commit_to_ack = Histogram(
            f"{prefix}_commit_to_ack_seconds",
            "Postgres commit time to Kafka acknowledgement of the whole transaction",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )


class Catalog:
    """Lazily-opened ordinary connection for the catalog questions the stream raises:
    unknown type OIDs (enums, domains, arrays) and primary keys of FULL-identity tables."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _conn(self) -> psycopg.Connection[tuple[object, ...]]:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.conninfo, autocommit=True)
        return self.conn

    def type_info(self, oid: int) -> TypeInfo | None:
        row = (
            self._conn()
            .execute(
                "SELECT t.oid, t.typname, t.typtype, t.typbasetype,"
                " CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE 0 END, t.typdelim"
                " FROM pg_catalog.pg_type t WHERE t.oid = %s",
                [oid],
            )
            .fetchone()
        )
        if row is None:
            return None
        return TypeInfo(
            int(str(row[0])),
            str(row[1]),
            str(row[2]),
            int(str(row[3])),
            int(str(row[4])),
            str(row[5]),
        )

    def primary_key(self, relation_oid: int) -> list[str]:
        rows = (
            self._conn()
            .execute(
                "SELECT a.attname FROM pg_catalog.pg_index i"
                " JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid"
                " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary",
                [relation_oid],
            )
            .fetchall()
        )
        return [str(r[0]) for r in rows]

    def wal_sender_timeout_s(self) -> float:
        row = (
            self._conn()
            .execute(
                "SELECT setting::float / 1000 FROM pg_catalog.pg_settings"
                " WHERE name = 'wal_sender_timeout'"
            )
            .fetchone()
        )
        return float(str(row[0])) if row else 60.0

    def slot_holder(self, slot: str) -> tuple[int, str] | None:
        """(pid, application_name) of the process streaming ``slot``, if any."""
        row = (
            self._conn()
            .execute(
                "SELECT s.active_pid, coalesce(a.application_name, '')"
                " FROM pg_catalog.pg_replication_slots s"
                " LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid"
                " WHERE s.slot_name = %s AND s.active",
                [slot],
            )
            .fetchone()
        )
        return None if row is None else (int(str(row[0])), str(row[1]))

    def snapshot_position(self) -> tuple[str, int]:
        """A snapshot and a WAL insert position read after it: every transaction visible in
        the snapshot wrote its commit record before that position."""
        conn = self._conn()
        snap = conn.execute("SELECT pg_catalog.pg_current_snapshot()::text").fetchone()
        lsn = conn.execute(
            "SELECT pg_catalog.pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
        ).fetchone()
        assert snap is not None
        assert lsn is not None
        return str(snap[0]), int(str(lsn[0]))

    def execute(self, statement: str, params: list[object]) -> None:
        self._conn().execute(statement, params)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class LeaderLock:
    """Session-level advisory lock naming the slot: whoever holds it streams.

    Held on its own ordinary connection for as long as the process streams; Postgres
    releases it the moment that connection dies, so a standby takes over within one
    ``poll_s`` of the leader's death. Postgres itself still refuses a second walsender on
    the slot, so the lock only makes the hand-over quick and quiet, never unsafe.
    """

    def __init__(self, conninfo: str, slot: str) -> None:
        self.conninfo = conninfo
        self.slot = slot
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._checked = time.monotonic()

    def acquire(
        self, stop: threading.Event, poll_s: float, tick: Callable[[], None] = lambda: None
    ) -> bool:
        """Block until leader (True) or stopped (False); ``tick`` runs every round, so
        liveness checks see a waiting standby as alive."""
        announced = False
        while not stop.is_set():
            tick()
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(
                    self.conninfo, autocommit=True, application_name=f"pg2kafka-lock:{self.slot}"
                )
            row = self.conn.execute(
                "SELECT pg_try_advisory_lock(hashtext('walcast.pg2kafka'), hashtext(%s))",
                [self.slot],
            ).fetchone()
            if row and row[0]:
                log.info("leader for slot %s", self.slot)
                return True
            if not announced:
                log.info("standby: another pg2kafka streams slot %s", self.slot)
                announced = True
            stop.wait(poll_s)
        return False

    def check(self, every_s: float) -> None:
        """While streaming: make sure the lock's session is still there. If it died, a
        standby may lead by now, so stop and start over as a candidate."""
        now = time.monotonic()
        if now - self._checked < every_s:
            return
        self._checked = now
        try:
            if self.conn is None or self.conn.closed:
                raise psycopg.OperationalError("lock connection closed")
            self.conn.execute("SELECT 1")
        except psycopg.Error as exc:
            raise RetriableError(f"lost the leader lock's session: {exc}") from exc

    def release(self) -> None:
        if self.conn is not None:
            self.conn.close()  # closing the session releases the lock
            self.conn = None


class Heartbeat:
    """Writes a non-transactional logical message into this database's WAL every
    ``interval_s`` while the pipeline is idle. The walsender streams it like any change,
    so the confirmed LSN moves past WAL that held nothing for us and the slot never pins
    it (an idle or fully filtered database). Not forwarded to Kafka."""

    PREFIX = "walcast.heartbeat"

    def __init__(self, catalog: Catalog, interval_s: float) -> None:
        self.catalog = catalog
        self.interval_s = interval_s
        self.last = time.monotonic()

    def maybe_beat(self) -> None:
        if self.interval_s <= 0 or time.monotonic() - self.last < self.interval_s:
            return
        self.last = time.monotonic()
        try:
            self.catalog.execute(
                "SELECT pg_logical_emit_message(false, %s, now()::text)", [self.PREFIX]
            )
        except psycopg.errors.InsufficientPrivilege as exc:
            # Keepalive positions still advance the slot; heartbeats only make it steadier.
            log.warning(
                "heartbeats disabled: %s (GRANT EXECUTE ON FUNCTION"
                " pg_logical_emit_message(boolean, text, text) TO this role)",
                exc,
            )
            self.interval_s = 0


class _Stream:
    """One connected streaming session: everything ``Pipeline.run_once`` creates, with
    the per-batch housekeeping and the per-message dispatch."""

    needs_kafka = True  # False: a session that must run while Kafka is away

    def __init__(self, pipeline: Pipeline, conninfo: str) -> None:
        s = pipeline.settings
        self.p = pipeline
        self.metrics = pipeline.metrics
        self.topic = pipeline.target.topic
        self.source = PostgresReplicationSource(
            conninfo,
            pipeline.target.slot,
            pipeline.target.publication,
            status_interval_s=s.replication.status_interval_s,
            wal_sender_timeout_s=s.replication.wal_sender_timeout_s,
        )
        self.sink = KafkaSink(
            {
                **s.kafka.client_config(),
                "linger.ms": s.producer.linger_ms,
                "batch.size": s.producer.batch_bytes,
                "batch.num.messages": s.producer.batch_messages,
                "compression.type": s.producer.compression,
                "message.timeout.ms": s.producer.delivery_timeout_ms,
                "message.max.bytes": s.producer.max_message_bytes,
            },
            max_inflight_bytes=s.producer.max_inflight_bytes,
            while_waiting=self.while_waiting,
        )
        self.tracker = AckTracker()
        self.sink.set_listener(self.tracker.acked)
        self.leader = LeaderLock(conninfo, pipeline.target.slot)
        self.catalog = Catalog(conninfo)
        self.heartbeat = Heartbeat(self.catalog, s.replication.heartbeat_interval_s)
        self.builder = EventBuilder(
            s.postgres.database,
            TypeRegistry(self.catalog.type_info),
            no_identity=s.replication.no_identity,
            primary_key=self.catalog.primary_key,
            scrub_secrets=s.ddl.scrub_secrets,
        )
        self.partitions: dict[str, int] = {}  # topic -> partition count, learnt once
        self.topics: dict[tuple[str, str], str] = {}  # (schema, table) -> topic
        self.seq = 0
        self.commit_times: deque[tuple[int, float]] = deque()
        self.op_counts: dict[str, int] = {}
        self.bytes_out = 0

    def while_waiting(self) -> None:
        """Runs while a write waits for Kafka (memory guard full, or librdkafka's queue):
        acks that arrive still confirm, the status keeps Postgres' connection alive, the
        liveness check sees a waiting loop, not a dead one."""
        self.p.tick()
        self.source.confirm(self.tracker.confirmed)
        self.source.maybe_send_status()
        self.leader.check(self.p.settings.replication.standby_poll_s * 5)

    def close(self) -> None:
        self.source.close()
        self.sink.close()
        self.catalog.close()
        self.leader.release()

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
            self.p.progressed = True
            now = time.time()
            while self.commit_times and tracker.is_done(self.commit_times[0][0]):
                _, committed = self.commit_times.popleft()
                self.metrics.commit_to_ack.observe(max(0.0, now - committed))
                self.metrics.transactions.inc()
        source.maybe_send_status()
        self.leader.check(self.p.settings.replication.standby_poll_s * 5)
        m = self.metrics
        for op, n in self.op_counts.items():
            m.events.labels(op).inc(n)
        self.op_counts.clear()
        if self.bytes_out:
            m.bytes.inc(self.bytes_out)
            self.bytes_out = 0
        if self.sink.waits:
            m.backpressure.inc(self.sink.waits)
            self.sink.waits = 0
        if self.builder.unconverted:
            m.unconverted.inc(self.builder.unconverted)
            self.builder.unconverted = 0
        if self.builder.malformed_ddl:
            m.malformed.inc(self.builder.malformed_ddl)
            self.builder.malformed_ddl = 0
        if self.builder.skipped_no_identity:
            m.skipped.inc(self.builder.skipped_no_identity)
            self.builder.skipped_no_identity = 0
        m.inflight.set(self.sink.inflight_bytes)
        m.confirmed.set(source.confirmed_lsn)
        m.lag.set(max(0, source.server_wal_end - source.confirmed_lsn))

    def handle(self, lsn: int, msg: pg.Decoded) -> None:
        """One decoded message, in stream order."""
        if isinstance(msg, (pg.Insert, pg.Update, pg.Delete)):
            for ev in self.builder.change(msg, lsn):
                if self.p.filter.matches(ev["schema"], ev["table"]):
                    self.send(ev)
        elif isinstance(msg, pg.Begin):
            self.seq = self.builder.begin(msg).seq
            self.tracker.open(self.seq)
        elif isinstance(msg, pg.Commit):
            self.builder.commit(msg)
            self.commit_times.append((self.seq, msg.commit_ts_us / 1e6))
            self.tracker.close(self.seq, msg.end_lsn)
        elif isinstance(msg, pg.Relation):
            self.builder.relation(msg)
        elif isinstance(msg, pg.Truncate):
            for ev in self.builder.truncate(msg, lsn):
                if self.p.filter.matches(ev["schema"], ev["table"]):
                    self.send(ev)
        elif isinstance(msg, pg.TypeMessage):
            self.builder.type_message(msg)
        elif isinstance(msg, pg.Message) and msg.prefix == DDL_PREFIX:
            if not msg.transactional or self.builder.txn is None:
                log.warning("ignoring a non-transactional DDL message at %s", pg.format_lsn(lsn))
                return
            for ev in self.builder.ddl(msg, lsn):
                if self.p.filter.matches(ev["schema"], ev["table"]):
                    self.send_ddl(ev)
        # Heartbeats, other logical messages and Origin only move the stream position.

    def ensure_topic(self, topic: str) -> int:
        """The topic's partition count; creates the topic first when configured to."""
        count = self.partitions.get(topic)
        if count is None:
            prod = self.p.settings.producer
            if prod.create_topic:
                ensure_topic(
                    self.p.settings.kafka.client_config(),
                    topic,
                    prod.topic_partitions,
                    prod.topic_replication_factor,
                )
            count = self.partitions[topic] = self.sink.partitions(topic)
        return count

    def topic_for(self, ev: Event) -> str:
        template = self.p.target.topic_template
        if template is None:
            return self.topic
        where = (ev["schema"], ev["table"])
        topic = self.topics.get(where)
        if topic is None:
            topic = template.format(db=ev["db"], schema=ev["schema"], table=ev["table"])
            self.ensure_topic(topic)
            self.topics[where] = topic
        return topic

    def send(self, ev: Event) -> None:
        value = self.p.serializer.encode(ev)
        self.tracker.sent(self.seq)
        self.sink.write(Outgoing(self.topic_for(ev), self.p.key_for(ev), value), self.seq)
        op = ev["op"]
        self.op_counts[op] = self.op_counts.get(op, 0) + 1
        self.bytes_out += len(value)

    def send_ddl(self, ev: Event) -> None:
        """Under primary-key keys a table's rows spread over every partition, so its
        schema change goes to every partition: each sees it before dependent rows."""
        if self.p.settings.producer.partition_key != "primary_key":
            self.send(ev)
            return
        value = self.p.serializer.encode(ev)
        key = f"{ev['schema']}.{ev['table']}".encode()
        topic = self.topic_for(ev)
        # Partitions may have been added since start: ask again (DDL is rare).
        partitions = self.partitions[topic] = self.sink.partitions(topic)
        for partition in range(partitions):
            self.tracker.sent(self.seq)
            self.sink.write(Outgoing(topic, key, value, partition=partition), self.seq)
        self.op_counts["ddl"] = self.op_counts.get("ddl", 0) + 1
        self.bytes_out += len(value) * partitions


class Maintenance:
    """Creates and drops event partitions every ``maintenance_interval_s``, whether or not
    events flow (the reference design only maintained while events arrived), and keeps the
    quarantined-events gauge current (every ``QUARANTINE_POLL_S`` at most)."""

    QUARANTINE_POLL_S = 15.0

    def __init__(self, settings: Pg2KafkaSettings, stop: threading.Event, metrics: Metrics) -> None:
        self.settings = settings
        self.stop = stop
        self.metrics = metrics

    def run(self) -> None:
        interval = self.settings.subscriptions.maintenance_interval_s
        due = 0.0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.settings.postgres.conninfo(), autocommit=True) as c:
                    if time.monotonic() >= due:
                        done = maintain_partitions(c, self.settings)
                        due = time.monotonic() + interval
                        log.info("partition maintenance", extra={"result": done})
                        if done.get("kept"):
                            log.warning(
                                "partitions past retention kept: they hold undelivered events",
                                extra={"kept": done["kept"]},
                            )
                    row = c.execute(
                        "SELECT count(*) FROM _walcast.subscription_errors WHERE stream_id = %s",
                        [self.settings.subscriptions.stream_id],
                    ).fetchone()
                    self.metrics.quarantined.set(row[0] if row else 0)
            except psycopg.Error as exc:
                log.warning("partition maintenance failed, retrying next round: %s", exc)
            self.stop.wait(min(interval, self.QUARANTINE_POLL_S))


@dataclass(frozen=True)
class StreamTarget:
    """Which slot a pipeline streams and where its messages go."""

    slot: str
    publication: str
    topic: str
    topic_template: str | None = None

    @classmethod
    def cdc(cls, settings: Pg2KafkaSettings) -> StreamTarget:
        return cls(
            settings.replication.slot,
            settings.replication.publication,
            settings.producer.topic,
            settings.producer.topic_template,
        )

    @classmethod
    def subscription_events(cls, settings: Pg2KafkaSettings) -> StreamTarget:
        sub = settings.subscriptions
        return cls(sub.slot, sub.publication, sub.topic)


@dataclass
class Pipeline:
    settings: Pg2KafkaSettings
    metrics: Metrics
    stop_event: threading.Event
    target: StreamTarget
    stream_cls: type[_Stream] = _Stream

    def __post_init__(self) -> None:
        self.serializer = JsonEventSerializer()
        self.filter = TableFilter(self.settings.filters.include, self.settings.filters.exclude)
        self.streaming = False
        self.progressed = False  # confirmed something since the last failure
        self.last_loop = time.monotonic()
        self._schema_keys: dict[str, bytes] = {}

    def key_for(self, ev: Event) -> bytes:
        mode = self.settings.producer.partition_key
        if mode == "schema":
            schema = ev["schema"]
            key = self._schema_keys.get(schema)
            if key is None:
                key = self._schema_keys[schema] = schema.encode()
            return key
        if mode == "table" or not ev.get("key"):
            return f"{ev['schema']}.{ev['table']}".encode()
        return orjson.dumps({"t": f"{ev['schema']}.{ev['table']}", "k": ev["key"]})

    def run_once(self) -> None:
        """Stream until stopped or a failure; resources are released either way."""
        s = self.settings
        st = self.stream_cls(self, s.postgres.conninfo())
        try:
            if self.stream_cls.needs_kafka and self.target.topic_template is None:
                st.ensure_topic(st.topic)  # fails fast on a missing topic
            if not st.leader.acquire(self.stop_event, s.replication.standby_poll_s, self.tick):
                return
            self.wait_for_slot(st)
            st.source.start()
            self.streaming = True
            batch_max = 2000
            while not self.stop_event.is_set():
                self.tick()
                st.housekeeping()
                batch = st.source.poll_batch(batch_max, 0.2)
                for lsn, msg in batch:
                    st.handle(lsn, msg)
                if batch:
                    self.metrics.batch.observe(len(batch))
            # Orderly stop: what is in flight gets its acks, then the final position.
            st.sink.flush(30)
            st.housekeeping()
            st.source.send_status()
        finally:
            self.streaming = False
            st.close()

    def tick(self) -> None:
        """The main loop is alive (read by the /health check)."""
        self.last_loop = time.monotonic()

    def wait_for_slot(self, st: _Stream) -> None:
        """As leader, give a previous leader's walsender ``slot_busy_grace_s`` to go; a
        slot still streamed by someone else after that belongs to another consumer."""
        # A walsender whose client vanished lingers up to wal_sender_timeout.
        rep = self.settings.replication
        timeout = rep.wal_sender_timeout_s or st.catalog.wal_sender_timeout_s()
        grace = max(rep.slot_busy_grace_s, timeout + 5)
        deadline = time.monotonic() + grace
        while True:
            holder = st.catalog.slot_holder(self.target.slot)
            if holder is None:
                return
            if time.monotonic() >= deadline:
                pid, app_name = holder
                if app_name == replication_application_name(self.target.slot):
                    # Another pg2kafka (a leader whose lock connection died): not ours to
                    # judge as misconfiguration; back off and try again.
                    raise RetriableError(f"slot still streamed by pg2kafka pid {pid}")
                raise PermanentError(
                    f"replication slot {self.target.slot!r} is streamed by"
                    f" another process (pid {pid}, application_name {app_name!r})",
                    hint="stop that consumer, or give pg2kafka its own replication.slot",
                )
            self.tick()
            self.stop_event.wait(0.5)
            if self.stop_event.is_set():
                return

    def run(self) -> None:
        """Run until stopped; transient failures reconnect with the configured backoff."""

        def progressed() -> bool:
            made, self.progressed = self.progressed, False
            return made

        call_with_retry(
            self.run_once,
            policy=self.settings.retry,
            what="stream the replication slot",
            sleep=self.stop_event.wait,
            progressed=progressed,
        )


@dataclass
class Service:
    settings: Pg2KafkaSettings
    registry: CollectorRegistry
    pipeline: Pipeline
    ops: OpsServer | None
    stop_event: threading.Event

    events: Pipeline | None = None

    def run(self) -> None:
        """Run the CDC pipeline here and, with subscriptions enabled, the events pipeline
        and the partition maintenance beside it. The first to fail stops the others."""
        if self.ops is not None:
            self.ops.start()
        threads: list[threading.Thread] = []
        errors: list[BaseException] = []

        def guarded(target: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    target()
                except BaseException as exc:  # noqa: BLE001 - re-raised by run()
                    errors.append(exc)
                    self.stop_event.set()

            return run

        if self.events is not None:
            maintenance = Maintenance(self.settings, self.stop_event, self.events.metrics)
            for name, target in (("events", self.events.run), ("maintenance", maintenance.run)):
                thread = threading.Thread(target=guarded(target), name=name, daemon=True)
                thread.start()
                threads.append(thread)
        try:
            guarded(self.pipeline.run)()
        finally:
            self.stop_event.set()
            for thread in threads:
                thread.join(60)
            if self.ops is not None:
                self.ops.stop()
        if errors:
            raise errors[0]

    def stop(self, *_: object) -> None:
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        stop_on_signals(self.stop, "after in-flight messages are acknowledged")


def build(settings: Pg2KafkaSettings) -> Service:
    """Compose pg2kafka from its settings; nothing connects until ``run``."""
    registry = CollectorRegistry()
    stop_event = threading.Event()
    pipeline = Pipeline(settings, Metrics(registry), stop_event, StreamTarget.cdc(settings))
    events: Pipeline | None = None
    if settings.subscriptions.enabled:
        from services.pg2kafka.subscriptions import SubscriptionPipeline

        events = SubscriptionPipeline(
            settings,
            Metrics(registry, prefix="walcast_pg2kafka_subscription"),
            stop_event,
            StreamTarget.subscription_events(settings),
        )
    ops: OpsServer | None = None
    if settings.http.enabled:
        ops = OpsServer(registry, settings.http.host, settings.http.port)
        ops.add_health_check(
            "loop",
            lambda: (time.monotonic() - pipeline.last_loop < 120, "main loop ticking"),
        )
        ops.add_ready_check("streaming", lambda: (pipeline.streaming, "replication streaming"))
        if events is not None:
            ev = events
            ops.add_health_check(
                "events_loop",
                lambda: (time.monotonic() - ev.last_loop < 120, "events loop ticking"),
            )
            ops.add_ready_check("events_streaming", lambda: (ev.streaming, "events streaming"))
    return Service(settings, registry, pipeline, ops, stop_event, events)


__all__ = ["Pipeline", "Service", "build"]
