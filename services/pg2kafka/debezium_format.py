"""pg2kafka's ``debezium`` output format: row changes as the Debezium PostgreSQL connector
writes them through Kafka Connect's JSON converter (``shared.formats.debezium`` holds the
encodings; docs/events.md, "The Debezium format", what differs).

Per change, from the pgoutput message itself (each value's text output, the relation's
types and type modifiers): the topic ``<prefix>.<schema>.<table>``, the key (the
replica-identity columns' struct; none for a table without one) and the envelope. As the
connector does with its defaults: an update that changes the key is a delete, its
tombstone and a create; a delete is followed by a tombstone (``debezium.tombstones``);
truncates and schema changes are not written (``skipped.operations = t``; the connector
has no DDL events for Postgres). A column's ``optional`` comes from the catalog
(``NOT NULL``), asked once per relation.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from services.pg2kafka import pgoutput as pg
from services.pg2kafka._native import RowHasher, convert_value
from services.pg2kafka.changes import Transaction
from services.pg2kafka.settings import DebeziumSettings
from services.pg2kafka.transforms import Transforms, unique_key
from services.pg2kafka.types import TypeRegistry
from shared.avro import ConnectRegistryEncoder
from shared.formats import debezium

VERSION = "walcast-0.1.0"
"""``source.version``: the producer (the connector writes its own version there)."""

UNAVAILABLE = debezium.UNAVAILABLE


@dataclass(frozen=True, slots=True)
class _Column:
    name: str
    type: str
    typmod: int
    split: str | None  # an array's spec that leaves its elements as text


@dataclass(frozen=True, slots=True)
class _Table:
    relation: pg.Relation
    topic: str
    columns: tuple[_Column, ...]
    keys: tuple[int, ...]  # positions of the key columns
    # NOT NULL columns outside the key -> what a key-only image holds for them
    absent: dict[int, Any]
    key_schema: dict[str, Any] | None
    value_schema: dict[str, Any] | None
    # The transform rules' rewrite of a row's values; ``relation`` is then the one the
    # stream sent and ``columns`` what the rules leave of it.
    apply: Callable[[tuple[pg.Value, ...]], tuple[pg.Value, ...]] | None = None
    # The row hash over the stream's columns, before any transform (``source.walcast_hash``).
    hasher: RowHasher | None = None


@dataclass(frozen=True, slots=True)
class Record:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone
    op: str


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """What the ``source`` of a snapshot's records says: ``lsn`` below every change
    streamed after the snapshot (walcast: the slot's restart position; the connector
    writes its consistent point, see services/pg2kafka/snapshots/rows.py ``snapshot_read``),
    ``started_us`` when the snapshot began (the same on every record of an initial
    snapshot's run; an incremental snapshot's row gives the time it was sent), ``xid``
    the reading transaction (walcast: the first transaction id its snapshot does not
    see; 0 for an incremental snapshot's row)."""

    lsn: int
    started_us: int
    xid: int
    kind: str = "true"  # source.snapshot: "true" (initial) or "incremental"


class DebeziumRecords:
    """Builds the records of one session's row changes. ``not_null(relation_oid)``: the
    columns declared NOT NULL; ``primary_key(relation_oid)``: its columns (the catalog,
    asked once per relation). ``transforms``: column rules, applied to every row before
    it is shaped (rewritten columns become strings in the schemas, NULLed ones optional)."""

    def __init__(
        self,
        settings: DebeziumSettings,
        database: str,
        types: TypeRegistry,
        not_null: Callable[[int], set[str]],
        primary_key: Callable[[int], list[str]],
        clock: Callable[[], int] = time.time_ns,
        avro: ConnectRegistryEncoder | None = None,
        transforms: Transforms | None = None,
    ) -> None:
        self.settings = settings
        self.transforms = transforms
        # producer.encoding=avro: keys and values as Confluent's AvroConverter writes
        # them (the schemas always built: the registry holds them).
        self.avro = avro
        self.database = database
        self.types = types
        self.not_null = not_null
        self.primary_key = primary_key
        self.clock = clock
        self._tables: dict[int, _Table] = {}
        self.last_commit_lsn: int | None = None

    def table(self, rel: pg.Relation) -> _Table:
        found = self._tables.get(rel.oid)
        if found is not None and (found.relation is rel or found.relation == rel):
            return found
        required = self.not_null(rel.oid)
        plan = None
        if self.transforms is not None:
            plan = self.transforms.plan(rel, unique_key(rel, self.primary_key))
        shaped = rel
        if plan is not None:
            shaped = plan.relation
            required = required - plan.nulled
        columns = []
        for c in shaped.columns:
            name = self.types.name(c.type_oid)
            spec = self.types.spec(c.type_oid)
            split = spec[:2] + "s" if name.startswith("_") and spec.startswith("a") else None
            columns.append(_Column(c.name, name, c.type_modifier, split))
        keys = tuple(i for i, c in enumerate(shaped.columns) if c.is_key)
        if rel.replica_identity == "f" and not self.primary_key(rel.oid):
            # REPLICA IDENTITY FULL flags every column as key; without a primary key the
            # connector's records have no key (and an update stays an update).
            keys = ()
        topic = debezium.record_name(self.settings.topic_prefix, rel.schema, rel.table)
        key_schema = value_schema = None
        if self.settings.schemas or self.avro is not None:
            fields = [
                debezium.field_schema(c.name, c.type, c.typmod, c.name not in required)
                for c in columns
            ]
            key_schema = debezium.key_schema(
                topic, [{**fields[i], "optional": False} for i in keys]
            )
            value_schema = debezium.value_schema(topic, fields)
        absent = {
            i: debezium.absent(debezium.field_schema(c.name, c.type, c.typmod))
            for i, c in enumerate(columns)
            if c.name in required and i not in keys
        }
        table = _Table(
            rel, topic, tuple(columns), keys, absent, key_schema, value_schema,
            plan.apply if plan is not None else None, RowHasher([c.name for c in rel.columns]),
        )  # fmt: skip
        self._tables[rel.oid] = table
        return table

    def _row(
        self, t: _Table, values: tuple[pg.Value, ...], only_key: bool = False
    ) -> dict[str, Any]:
        row: dict[str, Any] = {}
        keys = set(t.keys) if only_key else None
        if t.apply is not None:
            values = t.apply(values)
        for i, (col, text) in enumerate(zip(t.columns, values, strict=True)):
            if keys is not None and i not in keys:
                # A key-only image (a delete, a key change): the connector fills a
                # required column with its type's zero, the others with null.
                row[col.name] = t.absent.get(i)
            elif text is None:
                row[col.name] = None
            elif text is pg.UNCHANGED_TOAST:
                row[col.name] = _unavailable(col)
            elif col.split is not None:
                assert isinstance(text, str)
                items = orjson.loads(convert_value(col.split, text))
                row[col.name] = debezium.value(col.type, col.typmod, None, items)
            else:
                assert isinstance(text, str)
                row[col.name] = debezium.value(col.type, col.typmod, text)
        return row

    def _key(self, t: _Table, row: dict[str, Any]) -> bytes | None:
        if not t.keys:
            return None
        payload = {t.columns[i].name: row[t.columns[i].name] for i in t.keys}
        if self.avro is not None:
            return self.avro.encode(t.topic, {"schema": t.key_schema, "payload": payload}, True)
        return orjson.dumps(debezium.with_schema(payload, t.key_schema))

    def _value(
        self, t: _Table, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None,
        txn: Transaction | SnapshotRead, lsn: int, row_hash: int | None = None,
    ) -> bytes:  # fmt: skip
        rel = t.relation
        if isinstance(txn, SnapshotRead):
            when, snapshot, last_commit = txn.started_us, txn.kind, None
        else:
            when, snapshot, last_commit = txn.commit_us, "false", self.last_commit_lsn
        source = debezium.source(
            version=VERSION,
            prefix=self.settings.topic_prefix,
            db=self.database,
            schema=rel.schema,
            table=rel.table,
            commit_us=when,
            snapshot=snapshot,
            txid=txn.xid,
            lsn=lsn,
            last_commit_lsn=last_commit,
            row_hash=row_hash,
        )
        payload = debezium.envelope(op, before, after, source, self.clock() // 1000)
        if self.avro is not None:
            return self.avro.encode(t.topic, {"schema": t.value_schema, "payload": payload})
        return orjson.dumps(debezium.with_schema(payload, t.value_schema))

    def read(self, rel: pg.Relation, values: tuple[str | None, ...], snap: SnapshotRead) -> Record:
        """A row of a snapshot (each column's text output, as the snapshot's COPY gives
        it): an ``r`` record at ``snap.lsn``."""
        t = self.table(rel)
        after = self._row(t, values)
        value = self._value(t, "r", None, after, snap, snap.lsn, self._hash(t, values))
        return Record(t.topic, self._key(t, after), value, "read")

    def change(
        self, rel: pg.Relation, msg: pg.Insert | pg.Update | pg.Delete, txn: Transaction, lsn: int
    ) -> list[Record]:
        t = self.table(rel)
        if isinstance(msg, pg.Insert):
            after = self._row(t, msg.new)
            value = self._value(t, "c", None, after, txn, lsn, self._hash(t, msg.new))
            return [Record(t.topic, self._key(t, after), value, "insert")]
        if isinstance(msg, pg.Delete):
            return self._delete(t, self._row(t, msg.old, only_key=msg.old_kind == "K"), txn, lsn)
        after = self._row(t, msg.new)
        row_hash = self._hash(t, msg.new)
        before: dict[str, Any] | None = None
        if msg.old is not None:
            before = self._row(t, msg.old, only_key=msg.old_kind == "K")
        key = self._key(t, after)
        if before is not None and t.keys and self._key(t, before) != key:
            # The key changed: as the connector, a delete of the old key (and its
            # tombstone), then a create under the new one.
            create = Record(
                t.topic, key, self._value(t, "c", None, after, txn, lsn, row_hash), "insert"
            )
            return [*self._delete(t, before, txn, lsn), create]
        if before is not None and msg.old_kind == "K":
            before = None  # only the unchanged key: the connector writes no before image
        value = self._value(t, "u", before, after, txn, lsn, row_hash)
        return [Record(t.topic, key, value, "update")]

    @staticmethod
    def _hash(t: _Table, values: tuple[pg.Value, ...]) -> int | None:
        """The row hash of the stream's values (None: an unchanged TOAST value among them)."""
        return t.hasher.hash(values) if t.hasher is not None else None

    def mark(self, schema: str, table: str, mark_id: str, txn: Transaction, lsn: int) -> Record:
        """A verification marker for ``schema.table`` (``op: m``, no row images, the id in
        ``source.walcast_mark``; docs/events.md): the sender writes it to every partition
        of the table's topic, where it orders after every change the marker's transaction
        follows. Its schema is :func:`shared.formats.debezium.mark_schema`, whatever
        relation the stream last saw — a table that had no change this session has none."""
        source = debezium.source(
            version=VERSION, prefix=self.settings.topic_prefix, db=self.database,
            schema=schema, table=table, commit_us=txn.commit_us, snapshot="false",
            txid=txn.xid, lsn=lsn, last_commit_lsn=self.last_commit_lsn, mark=mark_id,
        )  # fmt: skip
        return self._marker(schema, table, source, "verify")

    def snapshot_end(self, schema: str, table: str, info: dict[str, Any], lsn: int) -> Record:
        """The end of an incremental snapshot of ``schema.table`` (``op: m``, no row images,
        walcast's ``snapshot`` block ``info`` as JSON in ``source.walcast_snapshot``, at
        ``lsn``: the snapshot's start version; docs/events.md): written to every partition
        of the table's topic, after the snapshot's rows there, as walcast's end marker."""
        now_us = self.clock() // 1000
        source = debezium.source(
            version=VERSION, prefix=self.settings.topic_prefix, db=self.database,
            schema=schema, table=table, commit_us=now_us, snapshot="incremental",
            txid=None, lsn=lsn, last_commit_lsn=None,
            snapshot_end=orjson.dumps(info).decode(),
        )  # fmt: skip
        return self._marker(schema, table, source, "snapshot")

    def _marker(self, schema: str, table: str, source: dict[str, Any], op: str) -> Record:
        topic = debezium.record_name(self.settings.topic_prefix, schema, table)
        now_us = self.clock() // 1000
        payload = {"source": source, "op": debezium.MARK_OP, "ts_ms": now_us // 1000,
                   "ts_us": now_us, "ts_ns": now_us * 1000}  # fmt: skip
        connect = debezium.mark_schema(topic)
        if self.avro is not None:
            value = self.avro.encode(topic, {"schema": connect, "payload": payload})
        else:
            value = orjson.dumps(
                debezium.with_schema(payload, connect if self.settings.schemas else None)
            )
        return Record(topic, None, value, op)

    def _delete(
        self, t: _Table, before: dict[str, Any], txn: Transaction, lsn: int
    ) -> list[Record]:
        key = self._key(t, before)
        out = [Record(t.topic, key, self._value(t, "d", before, None, txn, lsn), "delete")]
        if self.settings.tombstones and key is not None:
            out.append(Record(t.topic, key, None, "tombstone"))
        return out


def _unavailable(col: _Column) -> Any:
    """The connector's placeholder for an unchanged TOAST value: the text for strings
    (and for each element of an array of them), its bytes for binary columns."""
    schema = debezium.field_schema(col.name, col.type, col.typmod)
    if schema["type"] == "string":
        return UNAVAILABLE
    if schema["type"] == "bytes" and "name" not in schema:
        return base64.b64encode(UNAVAILABLE.encode()).decode()
    if schema["type"] == "array":
        items = schema["items"]["type"]
        if items in ("int16", "int32", "int64"):
            return list(UNAVAILABLE.encode())  # the connector: the placeholder's bytes
        return [UNAVAILABLE]
    return None
