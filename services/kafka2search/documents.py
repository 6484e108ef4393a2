"""Change events into search documents: validation, per-batch reduction, bulk bodies.

A batch keeps, per document, only the newest change (highest LSN; on a tie the later
one): the index ends up the same, the bulk is smaller. An update whose ``unchanged_toast``
columns were left out takes them from an older change of the same batch when it has them;
the rest are filled from the stored document before writing (``missing_toast``), so an
unchanged TOAST value is never erased.

Poison (not JSON, not an object, unknown ``v``, fields missing or of the wrong type)
raises :class:`PoisonMessageError` with the reason; the caller sends it to the dead-letter
topic. Nothing here talks to Kafka or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from services.kafka2search.mapping import document_id

SUPPORTED_VERSION = 1
DATA_OPS = ("insert", "update", "delete")
CONTROL_OPS = ("truncate", "ddl")
IGNORED_OPS = ("heartbeat", "message")


class PoisonMessageError(ValueError):
    """A record that is not a change event this service understands."""


class Origin(NamedTuple):
    """Where a record came from; a dead letter carries it. (A tuple: one is made per
    record, and a frozen dataclass costs three times as much to build.)"""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def parse(value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise PoisonMessageError("empty record (no value)")
    try:
        ev = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise PoisonMessageError(f"not JSON: {exc}") from exc
    if not isinstance(ev, dict):
        raise PoisonMessageError("not a JSON object")
    if ev.get("v") != SUPPORTED_VERSION:
        raise PoisonMessageError(f"unknown event version {ev.get('v')!r} (supported: 1)")
    op = ev.get("op")
    if op not in DATA_OPS + CONTROL_OPS + IGNORED_OPS:
        raise PoisonMessageError(f"unknown op {op!r}")
    if op in IGNORED_OPS:
        return ev
    for name in ("schema", "table", "db"):
        if not isinstance(ev.get(name), str):
            raise PoisonMessageError(f"field {name!r} missing or not a string")
    if not isinstance(ev.get("lsn"), int) or isinstance(ev.get("lsn"), bool) or ev["lsn"] < 0:
        raise PoisonMessageError("field 'lsn' missing or not a non-negative integer")
    if op in DATA_OPS:
        if not isinstance(ev.get("key"), dict):
            raise PoisonMessageError("field 'key' missing or not an object")
        if op != "delete" and not isinstance(ev.get("new"), dict):
            raise PoisonMessageError(f"{op} without a 'new' row")
        types = ev.get("types", {})
        if not isinstance(types, dict) or not all(type(t) is str for t in types.values()):
            raise PoisonMessageError("field 'types' is not an object of type names")
        toast = ev.get("unchanged_toast")
        if toast is not None and (
            not isinstance(toast, list) or not all(type(c) is str for c in toast)
        ):
            raise PoisonMessageError("field 'unchanged_toast' is not a list of column names")
    if op == "ddl":
        ddl = ev.get("ddl")
        if not isinstance(ddl, dict):
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


@dataclass(slots=True)
class Doc:
    """The newest change of one document in the batch."""

    index: str
    id: str
    delete: bool
    lsn: int
    source: dict[str, Any] | None
    missing_toast: list[str]
    origin: Origin


@dataclass
class Batch:
    """Documents reduced from the data events in hand, and the size of what they came
    from (the budget is on consumed bytes, which is what memory holds)."""

    docs: dict[tuple[str, str], Doc] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0

    def add(self, index: str, ev: dict[str, Any], origin: Origin) -> str | None:
        """Fold one insert/update/delete in; returns a reason when it cannot be indexed."""
        self.records += 1
        self.bytes += len(origin.value)
        doc_id = document_id(ev["key"])
        if doc_id is None:
            return "the table has no primary key or replica identity: no document id"
        lsn = ev["lsn"]
        delete = ev["op"] == "delete"
        new = None if delete else ev["new"]  # the parsed event is this batch's to keep
        missing = [] if delete else list(ev.get("unchanged_toast") or ())
        current = self.docs.get((index, doc_id))
        if current is not None:
            if lsn < current.lsn:
                return None  # older than what the batch holds: stale, nothing to do
            if missing and current.source is not None:
                assert new is not None
                for column in list(missing):
                    if column in current.source:
                        new[column] = current.source[column]
                        missing.remove(column)
                    elif column in current.missing_toast:
                        pass  # still unknown: the stored document has it
        self.docs[(index, doc_id)] = Doc(index, doc_id, delete, lsn, new, missing, origin)
        return None

    def __len__(self) -> int:
        return self.records

    def clear(self) -> None:
        self.docs.clear()
        self.records = 0
        self.bytes = 0


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
            lines.append(dumps(d.source))
    lines.append(b"")
    return b"\n".join(lines)
