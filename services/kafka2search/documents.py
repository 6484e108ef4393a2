"""Change events into search documents: validation, per-batch reduction, bulk bodies.

A batch keeps, per document, only the newest change (highest LSN; on a tie the later
one): the index ends up the same, the bulk is smaller. An update whose ``unchanged_toast``
columns were left out takes them from an older change of the same batch when it has them;
the rest are filled from the stored document before writing (``missing_toast``), so an
unchanged TOAST value is never erased.

This is the service's hot path (every record passes through it), so a row is never
decoded, nor even copied: :class:`Event` keeps ``new`` as the raw JSON pg2kafka wrote (a
view into the record's bytes), and that becomes the document's ``_source`` line in the
bulk body as is. Only a change whose unchanged TOAST values must be merged in, or a
record with a line break in it (pg2kafka writes none), is decoded and encoded again. A
table's ``types`` repeat in each of its events; they are decoded (and validated) once per
distinct value.

Poison (not JSON, not an object, unknown ``v``, fields missing or of the wrong type)
raises :class:`PoisonMessageError` with the reason; the caller sends it to the dead-letter
topic. Nothing here talks to Kafka or the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import msgspec
import orjson

from services.kafka2search.mapping import document_id

SUPPORTED_VERSION = 1
DATA_OPS = ("insert", "update", "delete")
CONTROL_OPS = ("truncate", "ddl")
IGNORED_OPS = ("heartbeat", "message")
_OPS = frozenset(DATA_OPS + CONTROL_OPS + IGNORED_OPS)
MAX_LSN = 2**63 - 1  # the engines' largest external version (a Java long)
_NO_TYPES: Mapping[str, str] = MappingProxyType({})

_ABSENT = msgspec.Raw(b"")


class PoisonMessageError(ValueError):
    """A record that is not a change event this service understands."""


class Origin(msgspec.Struct, frozen=True, gc=False):
    """Where a record came from; a dead letter carries it. (A struct: one is made per
    record, and its constructor runs in C.)"""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class Event(msgspec.Struct, gc=False):
    """The fields of a change event (docs/events.md) this service reads; the others are
    skipped unread. Scalars are left untyped here so that :func:`parse` gives the reasons
    an operator can act on. ``new`` and ``types`` are raw JSON (empty when absent): see
    the module doc. Not tracked by the garbage collector: it holds no cycles, and one is
    made per record."""

    v: Any = None
    op: Any = None
    db: Any = None
    schema: Any = None
    table: Any = None
    lsn: Any = None
    key: Any = None
    new: msgspec.Raw = _ABSENT
    types: msgspec.Raw = _ABSENT
    unchanged_toast: Any = None
    ddl: Any = None

    def column_types(self) -> Mapping[str, str]:
        """Column -> Postgres type name; shared between events, never to be mutated."""
        if not self.types:
            return _NO_TYPES
        last = _last_types  # (raw, decoded) of the previous call: most often the same
        if self.types == last[0]:  # compares the JSON text, without copying it
            return last[1]
        return _remember_types(self.types)


_decode_event = msgspec.json.Decoder(Event).decode
_decode_types = msgspec.json.Decoder(dict[str, str]).decode


@lru_cache(maxsize=1024)
def _column_types(raw: bytes) -> Mapping[str, str]:
    try:
        return _decode_types(raw)
    except msgspec.ValidationError as exc:
        raise PoisonMessageError(f"field 'types' is not an object of type names: {exc}") from exc


def _remember_types(raw: msgspec.Raw) -> Mapping[str, str]:
    global _last_types
    types = _column_types(bytes(raw))
    # One tuple: a reader on another thread sees a whole pair. A copy of the text: the
    # event's Raw would keep its whole record alive.
    _last_types = (raw.copy(), types)
    return types


_last_types: tuple[msgspec.Raw, Mapping[str, str]] = (_ABSENT, _NO_TYPES)


def _as_dict(source: msgspec.Raw | dict[str, Any]) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    row: dict[str, Any] = orjson.loads(bytes(source))
    return row


def parse(value: bytes | None) -> Event:
    if value is None:
        raise PoisonMessageError("empty record (no value)")
    try:
        ev = _decode_event(value)
    except msgspec.ValidationError:  # every field takes any JSON value but the record
        raise PoisonMessageError("not a JSON object") from None
    except msgspec.DecodeError as exc:
        raise PoisonMessageError(f"not JSON: {exc}") from exc
    except RecursionError:
        raise PoisonMessageError("not JSON: nested too deeply") from None
    if ev.v != SUPPORTED_VERSION:
        raise PoisonMessageError(f"unknown event version {ev.v!r} (supported: 1)")
    op = ev.op
    if type(op) is not str or op not in _OPS:
        raise PoisonMessageError(f"unknown op {op!r}")
    if op in IGNORED_OPS:
        return ev
    if type(ev.schema) is not str or type(ev.table) is not str or type(ev.db) is not str:
        for name in ("schema", "table", "db"):
            if type(getattr(ev, name)) is not str:
                raise PoisonMessageError(f"field {name!r} missing or not a string")
    if type(ev.lsn) is not int or not 0 <= ev.lsn <= MAX_LSN:
        raise PoisonMessageError("field 'lsn' missing or not an integer from 0 to 2^63-1")
    if op in DATA_OPS:
        if type(ev.key) is not dict:
            raise PoisonMessageError("field 'key' missing or not an object")
        # 123: "{" (a view, not a copy of the row; an absent row is empty)
        if op != "delete" and (not ev.new or memoryview(ev.new)[0] != 123):
            raise PoisonMessageError(f"{op} without a 'new' row")
        if ev.types:
            ev.column_types()  # validated (once per distinct value)
        toast = ev.unchanged_toast
        if toast is not None and (
            type(toast) is not list or not all(type(c) is str for c in toast)
        ):
            raise PoisonMessageError("field 'unchanged_toast' is not a list of column names")
    if op == "ddl":
        ddl = ev.ddl
        if type(ddl) is not dict:
            raise PoisonMessageError("ddl event without a 'ddl' object")
        columns = ddl.get("columns")
        if columns is not None and not (
            isinstance(columns, list)
            and all(
                isinstance(c, dict) and type(c.get("name")) is str and type(c.get("type")) is str
                for c in columns
            )
        ):
            raise PoisonMessageError("ddl 'columns' is not a list of {name, type} objects")
    return ev


class Doc(msgspec.Struct, gc=False):
    """The newest change of one document in the batch. ``source``: the row as raw JSON
    (one line, as the event carried it), or decoded once unchanged TOAST values had to be
    merged in; None for a delete. ``missing_toast``: unchanged TOAST columns still to be
    read from the stored document. (A struct: one is built per record, and its
    constructor runs in C.)"""

    index: str
    id: str
    delete: bool
    lsn: int
    source: msgspec.Raw | dict[str, Any] | None
    missing_toast: tuple[str, ...]
    origin: Origin

    def row(self) -> dict[str, Any]:
        """The source decoded, and kept so (for merging values into it)."""
        assert self.source is not None
        row = self.source = _as_dict(self.source)
        return row


@dataclass
class Batch:
    """Documents reduced from the data events in hand, and the size of what they came
    from (the budget is on consumed bytes, which is what memory holds)."""

    docs: dict[tuple[str, str], Doc] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    toast: int = 0  # documents added with unchanged TOAST columns (an upper bound after merges)

    def add(self, index: str, ev: Event, origin: Origin) -> str | None:
        """Fold one insert/update/delete in; returns a reason when it cannot be indexed."""
        self.records += 1
        self.bytes += len(origin.value)
        doc_id = document_id(ev.key)
        if doc_id is None:
            return "the table has no primary key or replica identity: no document id"
        lsn: int = ev.lsn
        source: msgspec.Raw | dict[str, Any] | None = None
        missing: tuple[str, ...] = ()
        if ev.op != "delete":
            source = ev.new
            toast = ev.unchanged_toast
            # 10: a newline anywhere in the record (pg2kafka writes none), so maybe in the
            # row, which must be one NDJSON line.
            if toast or 10 in origin.value:  # to merge into, or to be put on one line
                # Decoded here, so that neither a merge nor a fill can fail later: the
                # event decoder hands a row over unchecked.
                try:
                    source = _as_dict(source)
                except orjson.JSONDecodeError as exc:
                    return f"the row ('new') is not valid JSON: {exc}"
                if toast:
                    missing = tuple(toast)
                    self.toast += 1
        current = self.docs.get((index, doc_id))
        if current is not None:
            if lsn < current.lsn:
                return None  # older than what the batch holds: stale, nothing to do
            if missing and current.source is not None:
                assert isinstance(source, dict)
                try:
                    known = current.row()
                except orjson.JSONDecodeError:
                    known = {}  # the older change is replaced; the engine would refuse it
                for column in missing:
                    if column in known:
                        source[column] = known[column]
                # the others are still unknown: the stored document has them
                missing = tuple(c for c in missing if c not in known)
        delete = source is None
        self.docs[(index, doc_id)] = Doc(index, doc_id, delete, lsn, source, missing, origin)
        return None

    def __len__(self) -> int:
        return self.records

    def clear(self) -> None:
        self.docs.clear()
        self.records = 0
        self.bytes = 0
        self.toast = 0


def bulk_body(docs: list[Doc]) -> bytes:
    """NDJSON for the engine's bulk API: external versioning by LSN, so an older or
    repeated change is refused (409) instead of overwriting newer data."""
    lines: list[bytes] = []
    dumps = orjson.dumps
    index_json: dict[str, bytes] = {}
    for d in docs:
        index = index_json.get(d.index)
        if index is None:
            index = index_json[d.index] = dumps(d.index)
        # {"<action>":{"_index":…,"_id":…,"version":<lsn>,"version_type":"external"}}
        meta = b'{"_index":%b,"_id":%b,"version":%d,"version_type":"external"}}' % (
            index,
            dumps(d.id),
            d.lsn,
        )
        if d.delete:
            lines.append(b'{"delete":' + meta)
        else:
            lines.append(b'{"index":' + meta)
            src = d.source
            lines.append(src if isinstance(src, msgspec.Raw) else dumps(src))
    lines.append(b"")
    return b"\n".join(lines)
