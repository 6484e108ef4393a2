"""The CDC stream: every change of the published tables as a change event, keyed and
routed (``producer.partition_key``, ``producer.topic_template``), DDL in-stream.

:class:`CdcHandler` turns a session's messages into the output format's records — walcast's
events (:class:`WalcastCdc`: the builder in :mod:`services.pg2kafka.changes`, keys, topics)
or Debezium's (:class:`DebeziumCdc`) — for the tables the filter lets through;
:class:`CdcStream` runs sessions of it until stopped, reconnecting with the configured
backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import replace

import orjson
import psycopg

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import set_epoch
from services.pg2kafka.debezium_format import DebeziumRecords, Record, SnapshotRead
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.messages import MessageKey
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.output import Oversized, connect_encoder, output_format, value_encoder
from services.pg2kafka.replication import identify_system
from services.pg2kafka.routing import Routing
from services.pg2kafka.session import HandlerContext, SlotStream
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.snapshots.incremental import WATERMARK, Incremental, TextRow
from services.pg2kafka.source import SourceLedger
from services.pg2kafka.topics import StreamTarget
from services.pg2kafka.transforms import check_database, from_settings
from shared.contract.event import ChangeEvent
from shared.errors import PermanentError
from shared.kafka import Outgoing
from shared.logs import SampledLog

log = logging.getLogger(__name__)

DDL_PREFIX = "walcast.ddl"
VERIFY_PREFIX = "walcast.verify"  # verification marks (V020, docs/design.md#verification)
# acted on only when walcast signed them
_AUTHORED = frozenset({DDL_PREFIX, WATERMARK, VERIFY_PREFIX})


def joined_tables(content: bytes) -> frozenset[tuple[str, str]]:
    """The tables a DDL message says joined the publication in its statement (V018)."""
    try:
        payload = orjson.loads(content)
        return frozenset(
            (str(t["schema"]), str(t["table"])) for t in payload.get("tables", [])
            if isinstance(t, dict) and t.get("joined") is True
        )  # fmt: skip
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
        return frozenset()  # the builder reports a malformed message


class CdcHandler(ABC):
    """The stream's messages as records of the output format, for the tables the filter
    lets through: :class:`WalcastCdc` or :class:`DebeziumCdc`, chosen once by
    :func:`cdc_handler`. One per session: it caches the topics' limits the session's Kafka
    sink was told about. What both formats share lives here: which logical messages are
    walcast's own (signed), and which tables are left out for want of an identity."""

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        target: StreamTarget,
        incremental: Incremental | None = None,
        ledger: SourceLedger | None = None,
        messages: MessageKey | None = None,
    ) -> None:
        self.settings = settings
        self.incremental = incremental
        self.ledger = ledger
        # Only messages walcast signed move snapshot windows or become DDL events
        # (services/pg2kafka/messages.py); without a key, none does.
        self.messages = messages if messages is not None else MessageKey(None)
        self.target = target
        self.filter = TableFilter(settings.filters.include, settings.filters.exclude)
        self._keyless_warned: set[str] = set()
        self._limits: dict[str, int] = {}  # topic -> largest key + value it takes

    @abstractmethod
    def handle(self, session: HandlerContext, lsn: int, msg: pg.Decoded) -> None:
        """One message of the session's transaction, in WAL order: its records sent
        through ``session`` (part of the open transaction; the session confirms nothing
        Kafka has not acknowledged)."""

    def opened(self, session: HandlerContext, lsn: int, msg: pg.Message) -> pg.Message | None:
        """A message with one of walcast's prefixes, its body checked against its
        signature; None (counted) when walcast did not sign it. Other messages as they
        are."""
        if msg.prefix not in _AUTHORED:
            return msg
        b = session.builder
        body = self.messages.open(msg, lsn, b.txn.xid if b.txn is not None else None)
        if body is None:
            session.metrics.unauthenticated_messages.inc()
            return None
        return replace(msg, content=body)

    def limit(self, session: HandlerContext, topic: str) -> int:
        """The largest record (key and value) ``topic`` takes, asked once per session."""
        limit = self._limits.get(topic)
        if limit is None:
            limit = self._limits[topic] = session.value_limit(topic)
        return limit

    def check_keyless(self, session: HandlerContext) -> None:
        """Count (a gauge) and name (a warning, once per table) the matching tables left
        out of the publication for want of a replica identity: their changes are not
        streamed, and nobody should have to find that out from a sink."""
        try:
            tables = session.catalog.keyless_tables(self.settings.replication.publication)
        except psycopg.Error as exc:
            log.warning("could not list the tables without a replica identity: %s", exc)
            return
        session.metrics.keyless_tables.set(len(tables))
        new = [t for t in tables if t not in self._keyless_warned]
        if new:
            log.warning(
                "%d table(s) without a primary key or replica identity are not streamed (add"
                " a primary key, or set filters.keyless_tables=full_identity): %s",
                len(new),
                ", ".join(new[:20]) + (" ..." if len(new) > 20 else ""),
            )
        self._keyless_warned = set(tables)

    def housekeeping(self, session: HandlerContext) -> bool:
        """Between messages: incremental snapshots' chunks recorded and taken, the
        source's ledger follows the confirmed position."""
        if self.incremental is not None:
            self.incremental.housekeeping(session, self)
        if self.ledger is not None:
            self.ledger.advance(session.confirmed_lsn)
        return False

    def while_waiting(self, session: HandlerContext) -> None:
        """Nothing to do while Kafka catches up."""
        return None

    def close(self) -> None:
        if self.incremental is not None:
            self.incremental.session_ended()

    @abstractmethod
    def send_read(
        self, session: HandlerContext, rel: pg.Relation, values: TextRow, ev: ChangeEvent
    ) -> None:
        """An incremental snapshot's read row in the format's records (its ``Sender``)."""

    @abstractmethod
    def send_table_wide(self, session: HandlerContext, ev: ChangeEvent) -> None:
        """A table-wide event (a truncate, a schema change, a snapshot's end marker) on
        every partition the table's rows can be in."""

    def snapshot_hooks(self, session: HandlerContext, lsn: int, msg: pg.Decoded) -> None:
        """What moves incremental snapshots, whatever the format: a change's key into its
        chunk's window, a truncate as the table's floor, a watermark."""
        inc = self.incremental
        if inc is None:
            return
        b = session.builder
        if isinstance(msg, (pg.Insert, pg.Update, pg.Delete)):
            if inc.window_tables:
                for ev in b.change(msg, lsn):
                    if self.filter.matches(ev["schema"], ev["table"]):
                        inc.changed(ev)
        elif isinstance(msg, pg.Truncate):
            for ev in b.truncate(msg, lsn):
                if self.filter.matches(ev["schema"], ev["table"]):
                    inc.floor(ev["schema"], ev["table"], lsn)
        elif (
            isinstance(msg, pg.Message) and msg.prefix == WATERMARK
            and msg.transactional and b.txn is not None
        ):  # fmt: skip
            inc.watermark(session, self, lsn, msg)

    @staticmethod
    def table_level(ev: ChangeEvent, joined: frozenset[tuple[str, str]]) -> bool:
        """Whether a DDL event is a table-level position sinks order rows against (its
        floor, shared.contract.event.read_row_version): the table created (again), or a
        table that joined the publication in this statement (gained a key, as an
        insert-only table does: the rows it appended all lie below, and the snapshot that
        follows — its rows and end marker above — replaces them). The trigger says which
        tables joined (V018), so a restart in between changes nothing."""
        tag = str((ev.get("ddl") or {}).get("tag", "")).upper()
        return tag == "CREATE TABLE" or (ev["schema"], ev["table"]) in joined

    def everywhere(self, session: HandlerContext, topic: str, value: bytes, op: str) -> None:
        """One record on every partition of ``topic`` (made if it is new)."""
        if topic not in self._limits:
            session.ensure_topic(topic)
        partitions = session.refresh_partitions(topic)
        for partition in range(partitions):
            session.write(Outgoing(topic, None, value, partition=partition))
        session.count(op, len(value) * partitions)


class WalcastCdc(CdcHandler):
    """walcast's change events (docs/events.md): row changes keyed and routed
    (``producer.partition_key``, ``producer.topic_template``), truncates and DDL as
    table-wide events, incremental snapshots' windows moved by their watermarks — and the
    path an incremental snapshot sends its rows and markers through (its ``Sender``)."""

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        target: StreamTarget,
        incremental: Incremental | None = None,
        ledger: SourceLedger | None = None,
        messages: MessageKey | None = None,
    ) -> None:
        super().__init__(settings, target, incremental, ledger, messages)
        # The source's epoch (services/pg2kafka/source.py): on every event from 1 on.
        self.epoch = ledger.current.epoch if ledger is not None and ledger.current else 0
        # producer.encoding: JSON, or Avro with per-table schemas in the registry.
        self.values = value_encoder(settings)
        self._encode = self.values.encode  # bound once: called per event
        self._session: HandlerContext | None = None
        self.routing = Routing(settings, target, self._ensure_topic)
        self.oversized: Oversized | None = None  # made with the session's metrics

    def handle(self, session: HandlerContext, lsn: int, msg: pg.Decoded) -> None:
        b = session.builder
        inc = self.incremental
        if isinstance(msg, (pg.Insert, pg.Update, pg.Delete)):
            for ev in b.change(msg, lsn):
                if self.filter.matches(ev["schema"], ev["table"]):
                    self.send(session, ev)
                    if inc is not None and inc.window_tables:
                        inc.changed(ev)
        elif isinstance(msg, pg.Truncate):
            for ev in b.truncate(msg, lsn):
                if self.filter.matches(ev["schema"], ev["table"]):
                    self.send_table_wide(session, ev)
                    if inc is not None:
                        inc.floor(ev["schema"], ev["table"], lsn)
        elif isinstance(msg, pg.Message):
            opened = self.opened(session, lsn, msg)
            if opened is None:
                return
            if opened.prefix == WATERMARK:
                self.snapshot_hooks(session, lsn, opened)
            elif opened.prefix == DDL_PREFIX:
                self.ddl(session, lsn, opened)
            elif opened.prefix == VERIFY_PREFIX and opened.transactional and b.txn is not None:
                # on every partition of each table, like a truncate: a sink has applied
                # everything before it once each partition's offsets pass it
                for ev in b.verify_marks(opened, lsn):
                    if self.filter.matches(ev["schema"], ev["table"]):
                        self.send_table_wide(session, ev)
        # Commits, heartbeats, other logical messages and Origin only move the position.

    def ddl(self, session: HandlerContext, lsn: int, msg: pg.Message) -> None:
        b = session.builder
        inc = self.incremental
        if not msg.transactional or b.txn is None:
            log.warning("ignoring a non-transactional DDL message at %s", pg.format_lsn(lsn))
            return
        joined = joined_tables(msg.content)
        for ev in b.ddl(msg, lsn):
            if self.filter.matches(ev["schema"], ev["table"]):
                self.send_table_wide(session, ev)
                if inc is not None and self.table_level(ev, joined):
                    inc.floor(ev["schema"], ev["table"], lsn)
        self.check_keyless(session)  # a table may have gained or lost its identity

    def _ensure_topic(self, topic: str) -> int:
        assert self._session is not None
        return self._session.ensure_topic(topic)

    def key_for(self, ev: ChangeEvent) -> bytes:
        return self.routing.key(ev)

    def topic_for(self, session: HandlerContext, ev: ChangeEvent) -> str:
        self._session = session
        return self.routing.topic(ev["db"], ev["schema"], ev["table"])

    def send(self, session: HandlerContext, ev: ChangeEvent) -> None:
        if self.epoch:
            set_epoch(ev, self.epoch)
        topic = self.topic_for(session, ev)
        value = self._encode(topic, ev)
        key = self.key_for(ev)
        if len(value) + len(key) > self.limit(session, topic):
            oversized = self.oversized
            if oversized is None:
                oversized = self.oversized = Oversized(self.values, session.metrics.oversized.inc)
            value = oversized.event(topic, ev, len(value))
        session.send(Outgoing(topic, key, value), ev["op"])

    def send_read(
        self, session: HandlerContext, rel: pg.Relation, values: TextRow, ev: ChangeEvent
    ) -> None:
        self.send(session, ev)

    def send_table_wide(self, session: HandlerContext, ev: ChangeEvent) -> None:
        """A truncate or a schema change: where :meth:`Routing.table_wide` says."""
        topic = self.topic_for(session, ev)
        where = self.routing.table_wide(
            ev["schema"], ev["table"], lambda: session.refresh_partitions(topic)
        )
        if where is None:
            self.send(session, ev)
            return
        if self.epoch:
            set_epoch(ev, self.epoch)
        value = self._encode(topic, ev)
        for key, partition in where:
            session.write(Outgoing(topic, key, value, partition=partition))
        session.count(ev["op"], len(value) * len(where))


class DebeziumCdc(CdcHandler):
    """The Debezium connector's records (services/pg2kafka/debezium_format.py): row
    changes (its connector's defaults write neither truncates nor schema changes; a
    schema change still re-checks which tables are left out for want of an identity),
    verification markers, and incremental snapshots — their rows as ``r`` records, a
    table's end as an ``m`` record (docs/events.md)."""

    # Made with the session's type registry and catalog, on the first change.
    records: DebeziumRecords | None = None
    _verify_log = SampledLog(log, "verification marks not written")

    def handle(self, session: HandlerContext, lsn: int, msg: pg.Decoded) -> None:
        b = session.builder
        if isinstance(msg, (pg.Insert, pg.Update, pg.Delete)):
            rel = b.relations.get(msg.relation_oid)
            if rel is None:
                raise PermanentError(
                    f"pgoutput protocol: change for relation {msg.relation_oid} before its"
                    " Relation message"
                )
            if not self.filter.matches(rel.schema, rel.table) or b.txn is None:
                return
            for r in self._records(session).change(rel, msg, b.txn, lsn):
                self._send(session, r, f"a change of {rel.schema}.{rel.table} at LSN"
                           f" {pg.format_lsn(lsn)}")  # fmt: skip
            self.snapshot_hooks(session, lsn, msg)
        elif isinstance(msg, pg.Truncate):
            self.snapshot_hooks(session, lsn, msg)  # not written (the connector's default)
        elif isinstance(msg, pg.Commit):
            if self.records is not None:
                self.records.last_commit_lsn = msg.commit_lsn
        elif isinstance(msg, pg.Message):
            opened = self.opened(session, lsn, msg)
            if opened is not None and opened.prefix == DDL_PREFIX:
                self.ddl_floors(session, lsn, opened)  # no DDL records in this format
                self.check_keyless(session)
            elif opened is not None and opened.prefix == VERIFY_PREFIX:
                self.verify_marks(session, lsn, opened)
            elif opened is not None and opened.prefix == WATERMARK:
                self.snapshot_hooks(session, lsn, opened)

    def ddl_floors(self, session: HandlerContext, lsn: int, msg: pg.Message) -> None:
        """The floors a DDL message sets for incremental snapshots (the tables it created,
        or that joined the publication: :meth:`table_level`), read from the message alone
        — this format writes no DDL records, and builds none (nor checks them against
        transform rules, which its records apply per relation)."""
        if self.incremental is None or not msg.transactional or session.builder.txn is None:
            return
        try:
            payload = orjson.loads(msg.content)
            tag = str(payload.get("tag", "")).upper()
            tables = [t for t in payload.get("tables", []) if isinstance(t, dict)]
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return  # malformed: the walcast format's builder would skip it too
        for t in tables:
            schema, table = t.get("schema"), t.get("table")
            if not (isinstance(schema, str) and isinstance(table, str)):
                continue
            if (tag == "CREATE TABLE" or t.get("joined") is True) and self.filter.matches(
                schema, table
            ):
                self.incremental.floor(schema, table, lsn)

    def _send(self, session: HandlerContext, r: Record, where: str) -> None:
        if r.topic not in self._limits:
            session.ensure_topic(r.topic)
        size = len(r.value or b"") + len(r.key or b"")
        limit = self.limit(session, r.topic)
        if size > limit:
            raise Oversized.record(where, r.topic, size, limit)
        session.send(Outgoing(r.topic, r.key, r.value), r.op)

    def send_read(
        self, session: HandlerContext, rel: pg.Relation, values: TextRow, ev: ChangeEvent
    ) -> None:
        """An incremental snapshot's row as the connector's ``r`` record of an incremental
        snapshot, at ``source.lsn`` one above the row's version (a sink reads an ``r``
        record's version one below it), ``source.txId`` 0 (a read row, of no
        transaction)."""
        snap = SnapshotRead(int(ev["lsn"]) + 1, time.time_ns() // 1000, 0, "incremental")
        r = self._records(session).read(rel, values, snap)
        self._send(session, r, f"a row of {rel.schema}.{rel.table}'s incremental snapshot")

    def send_table_wide(self, session: HandlerContext, ev: ChangeEvent) -> None:
        """The end of a table's incremental snapshot, as an ``m`` record with walcast's
        ``snapshot`` block (the only table-wide event incremental snapshots send)."""
        if ev["op"] != "snapshot" or not ev.get("snapshot"):
            return
        r = self._records(session).snapshot_end(
            ev["schema"], ev["table"], dict(ev["snapshot"]), int(ev["lsn"])
        )
        if r.value is not None:
            self.everywhere(session, r.topic, r.value, r.op)

    def verify_marks(self, session: HandlerContext, lsn: int, msg: pg.Message) -> None:
        """A verification mark: a marker record (``op: m``) on every partition of each
        table's topic, as walcast's format does with its ``verify`` event — a sink has
        applied everything before it once each partition's offsets pass it. Off with
        ``debezium.verify_marks: false`` (for consumers that cannot skip such records)."""
        b = session.builder
        if not msg.transactional or b.txn is None:
            return
        if not self.settings.debezium.verify_marks:
            self._verify_log.warning(
                "verify", "a verification mark was asked for; debezium.verify_marks is"
                " false: no marker written, the sinks' verify will wait for it in vain",
            )  # fmt: skip
            return
        records = self._records(session)
        for ev in b.verify_marks(msg, lsn):
            schema, table = ev["schema"], ev["table"]
            if not self.filter.matches(schema, table):
                continue
            r = records.mark(schema, table, ev["verify"]["id"], b.txn, lsn)
            if r.value is not None:  # a table without a change yet: its topic made
                self.everywhere(session, r.topic, r.value, r.op)

    def _records(self, session: HandlerContext) -> DebeziumRecords:
        if self.records is None:
            self.records = DebeziumRecords(
                self.settings.debezium,
                self.settings.postgres.database,
                session.builder.types,
                session.catalog.not_null,
                session.catalog.primary_key,
                avro=connect_encoder(self.settings),
                transforms=from_settings(self.settings.transforms),
            )
        return self.records


def cdc_handler(
    settings: Pg2KafkaSettings,
    target: StreamTarget,
    incremental: Incremental | None = None,
    ledger: SourceLedger | None = None,
    messages: MessageKey | None = None,
) -> CdcHandler:
    """The handler of ``producer.format``'s records."""
    kind = DebeziumCdc if output_format(settings).connect_records else WalcastCdc
    return kind(settings, target, incremental, ledger, messages)


class CdcStream(SlotStream):
    """Sessions of the CDC slot, one after another, until stopped."""

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        metrics: Metrics,
        stop: threading.Event,
        target: StreamTarget | None = None,
    ) -> None:
        super().__init__(settings, metrics, stop, target or StreamTarget.cdc(settings))
        self.incremental: Incremental | None = Incremental(settings, stop, metrics)
        self.transforms_checked = False

    def run_once(self) -> None:
        """As leader: the initial snapshot when one is owed (``snapshot.mode``), then one
        session, until stopped or a failure (raised)."""
        from services.pg2kafka.snapshots.initial import drop_slot, initial_snapshot

        s = self.settings
        transforms = from_settings(s.transforms)
        if transforms is not None and not self.transforms_checked:
            # Once per process, before it leads or stands by (a reconnect does not check
            # again: a rule a DDL made void is logged then, and refused at the next start).
            check_database(transforms, s.postgres.conninfo(), TableFilter(
                s.filters.include, s.filters.exclude), slot=self.target.slot)  # fmt: skip
            self.transforms_checked = True
        leader = self.lead()
        if leader is None:
            return  # stopped while standing by
        ledger = SourceLedger(s)
        try:
            epoch = self.begin_epoch(ledger)
            if self.incremental is not None:
                self.incremental.epoch = epoch
            if s.snapshot.mode != "never":
                self.live.snapshotting = True
                try:
                    outcome = initial_snapshot(
                        s, self.metrics, self.stop, self.leader_tick(leader), epoch
                    )
                finally:
                    self.live.snapshotting = False
                self.live.progressed = outcome in ("done", "cancelled")
                if outcome == "stopped":
                    return
                if s.snapshot.mode == "initial_only":
                    if outcome != "none":
                        drop_slot(s)
                    else:
                        log.warning(
                            "initial_only: slot %s exists and owes no snapshot; nothing done",
                            self.target.slot,
                        )
                    self.stop.set()
                    return
            with psycopg.connect(s.postgres.conninfo(), autocommit=True) as conn:
                messages = MessageKey.load(conn)
            session = self.session(leader)
            handler = cdc_handler(self.settings, self.target, self.incremental, ledger, messages)
            handler.check_keyless(session)
            session.run(handler)
        finally:
            if self.incremental is not None:
                self.incremental.close()
            ledger.close()
            self.step_down(leader)

    def begin_epoch(self, ledger: SourceLedger) -> int:
        """The epoch this leadership streams under: the stream's, or the next one when the
        server is not the source the stream carried (services/pg2kafka/source.py). The
        snapshots a new source needs are asked for before the epoch is recorded."""
        from services.pg2kafka.snapshots.initial import after_source_change

        record, reason = ledger.start(identify_system(self.settings.postgres.conninfo()))
        self.metrics.epoch.set(record.epoch)
        if reason is None:
            return record.epoch
        log.warning(
            "the source changed: %s. Epoch %d begins: its changes order after every change"
            " the sinks hold, whatever their LSNs",
            reason,
            record.epoch,
        )
        log.warning("after the change of source: %s", after_source_change(self.settings, reason))
        ledger.commit(record)
        return record.epoch
