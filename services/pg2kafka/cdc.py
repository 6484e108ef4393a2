"""The CDC stream: every change of the published tables as a change event, keyed and
routed (``producer.partition_key``, ``producer.topic_template``), DDL in-stream.

:class:`CdcHandler` turns a session's messages into events (the builder in
:mod:`services.pg2kafka.changes`, the table filter, keys, topics); :class:`CdcStream`
runs sessions of it until stopped, reconnecting with the configured backoff.
"""

from __future__ import annotations

import logging
import threading

import orjson
import psycopg

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.session import ReplicationSession, SlotStream, StreamTarget
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.contract.event import ChangeEvent, JsonEventSerializer
from shared.interfaces import Serializer
from shared.kafka import Outgoing
from shared.logs import SampledLog
from shared.naming import KAFKA_TOPIC, table_name

log = logging.getLogger(__name__)

DDL_PREFIX = "walcast.ddl"
_ROWS = frozenset({"new", "old", "unchanged_toast"})


class CdcHandler:
    """Change events of the tables the filter lets through. One per session: it caches
    keys and topics the session's Kafka sink was told about."""

    def __init__(self, settings: Pg2KafkaSettings, target: StreamTarget) -> None:
        self.settings = settings
        self.target = target
        self.filter = TableFilter(settings.filters.include, settings.filters.exclude)
        self.mode = settings.producer.partition_key
        self.serializer: Serializer[ChangeEvent] = JsonEventSerializer()
        self._encode = self.serializer.encode  # bound once: called per event
        self._schema_keys: dict[str, bytes] = {}
        self._topics: dict[tuple[str, str], str] = {}  # (schema, table) -> topic
        self._keyless_warned: set[str] = set()
        self._limits: dict[str, int] = {}  # topic -> largest key + value it takes
        self._oversized_log = SampledLog(log, "oversized changes")

    def handle(self, session: ReplicationSession, lsn: int, msg: pg.Decoded) -> None:
        b = session.builder
        if isinstance(msg, (pg.Insert, pg.Update, pg.Delete)):
            for ev in b.change(msg, lsn):
                if self.filter.matches(ev["schema"], ev["table"]):
                    self.send(session, ev)
        elif isinstance(msg, pg.Truncate):
            for ev in b.truncate(msg, lsn):
                if self.filter.matches(ev["schema"], ev["table"]):
                    self.send_table_wide(session, ev)
        elif isinstance(msg, pg.Message) and msg.prefix == DDL_PREFIX:
            if not msg.transactional or b.txn is None:
                log.warning("ignoring a non-transactional DDL message at %s", pg.format_lsn(lsn))
                return
            for ev in b.ddl(msg, lsn):
                if self.filter.matches(ev["schema"], ev["table"]):
                    self.send_table_wide(session, ev)
            self.check_keyless(session)  # a table may have gained or lost its identity
        # Commits, heartbeats, other logical messages and Origin only move the position.

    def check_keyless(self, session: ReplicationSession) -> None:
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

    def housekeeping(self, session: ReplicationSession) -> bool:
        return False

    def while_waiting(self, session: ReplicationSession) -> None:
        pass

    def close(self) -> None:
        pass

    def key_for(self, ev: ChangeEvent) -> bytes:
        if self.mode == "schema":
            schema = ev["schema"]
            key = self._schema_keys.get(schema)
            if key is None:
                key = self._schema_keys[schema] = schema.encode()
            return key
        if self.mode == "table" or not ev.get("key"):
            return f"{ev['schema']}.{ev['table']}".encode()
        return orjson.dumps({"t": f"{ev['schema']}.{ev['table']}", "k": ev["key"]})

    def topic_for(self, session: ReplicationSession, ev: ChangeEvent) -> str:
        template = self.target.topic_template
        if template is None:
            return self.target.topic
        where = (ev["schema"], ev["table"])
        topic = self._topics.get(where)
        if topic is None:
            # Table names may hold what Kafka refuses ("Order Items"): sanitised and made
            # collision-free (shared.naming).
            topic = table_name(template, KAFKA_TOPIC, ev["db"], ev["schema"], ev["table"])
            session.ensure_topic(topic)
            self._topics[where] = topic
        return topic

    def send(self, session: ReplicationSession, ev: ChangeEvent) -> None:
        value = self._encode(ev)
        topic = self.topic_for(session, ev)
        key = self.key_for(ev)
        limit = self._limits.get(topic)
        if limit is None:
            limit = self._limits[topic] = session.value_limit(topic)
        if len(value) + len(key) > limit:
            value = self.reference(session, ev, len(value))
        session.send(Outgoing(topic, key, value), ev["op"])

    def reference(self, session: ReplicationSession, ev: ChangeEvent, size: int) -> bytes:
        """A change larger than the topic takes would stop the stream for good (Kafka
        refuses it, and it is first in line again after every restart): in its place goes
        a reference — the same event without its rows, with ``oversized`` = its size —
        which consumers dead-letter with that reason. Counted and logged, never a stop."""
        ref: ChangeEvent = {k: v for k, v in ev.items() if k not in _ROWS}  # type: ignore[assignment]
        ref["new"] = None
        ref["old"] = None
        ref["oversized"] = size
        session.metrics.oversized.inc()
        self._oversized_log.warning(
            f"{ev.get('schema')}.{ev.get('table')}",
            "a change of %s.%s (key %.200s, LSN %s) is %d bytes, more than its topic takes:"
            " sent as a reference without its rows",
            ev.get("schema"),
            ev.get("table"),
            orjson.dumps(ev.get("key")).decode(),
            ev.get("lsn"),
            size,
        )
        return self._encode(ref)

    def send_table_wide(self, session: ReplicationSession, ev: ChangeEvent) -> None:
        """A truncate or a schema change concerns every row of the table. Under
        primary-key keys the rows spread over every partition, so the event goes to every
        partition: each partition's consumer sees it in order with the rows around it (a
        truncate sent to one partition only would, in a consumer reading the others
        first, remove rows written after it). Sinks apply it once, by its LSN."""
        if self.mode != "primary_key":
            self.send(session, ev)
            return
        value = self.serializer.encode(ev)
        key = f"{ev['schema']}.{ev['table']}".encode()
        topic = self.topic_for(session, ev)
        partitions = session.refresh_partitions(topic)  # rare events: ask again
        for partition in range(partitions):
            session.write(Outgoing(topic, key, value, partition=partition))
        session.count(ev["op"], len(value) * partitions)


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

    def run_once(self) -> None:
        """One session, until stopped or a failure (raised)."""
        session = self.session()
        handler = CdcHandler(self.settings, self.target)
        handler.check_keyless(session)
        session.run(handler)
