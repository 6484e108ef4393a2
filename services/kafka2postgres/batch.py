"""Change events into per-table batches: the newest change per key.

A batch keeps, per table and key, one change: the one with the highest version (on a tie,
the later). An update that left unchanged TOAST values out takes them from the change of
its key the batch held when it arrived — the key's previous state in the stream, so the
value is the current one. A row that arrives *after* the key's newer change at a lower
version (a redelivery after a producer restart, a snapshot's read row) is not merged into
it: the target may hold a newer value than it (an update applied by an earlier batch),
or it may be from before the table's floor (dropped and created again, truncated). It is
kept as the key's *filler* instead, applied after the batch's changes by the same
statement, where it can only fill columns the target holds no value for (the contract's
rule, :func:`shared.contract.event.fill_unfilled`: a full row is never refused in favour
of a partial one). What no change of the batch carries is left to the target
(:mod:`services.kafka2postgres.statements`).

Rows stay the JSON the event carried; only a merge decodes them, member by member as raw
JSON (``msgspec.Raw``), so a ``json`` value keeps its exact text. Nothing here talks to
Kafka or Postgres.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
import orjson

from services.kafka2postgres.schema import ROW_ID
from shared.contract.event import EventView
from shared.interfaces import Origin

Source = tuple[str, str, str]

_decode_row = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_encode = msgspec.json.encode


class Change(msgspec.Struct, gc=False):
    """The newest change of one key in the batch."""

    version: int
    delete: bool
    row: bytes  # the row (a delete: its key) as JSON
    unchanged: list[str] | None
    hash: int | None
    xid: int
    new: bool = False  # a read row or an insert: the bulk path may take it (.copying)

    def element(self) -> bytes:
        """This change as one element of the apply statement's JSON array."""
        u = b"null" if self.unchanged is None else orjson.dumps(self.unchanged)
        h = b"null" if self.hash is None else str(self.hash).encode()
        return b'{"v":%d,"d":%s,"u":%s,"h":%s,"x":%d,"r":%s}' % (
            self.version, b"true" if self.delete else b"false", u, h, self.xid, self.row,
        )  # fmt: skip


@dataclass
class TableBatch:
    """One table's part of a batch."""

    changes: dict[bytes, Change] = field(default_factory=dict)
    # older rows that arrived after the newer partial change of their key (see above)
    fillers: dict[bytes, Change] = field(default_factory=dict)
    origins: list[Origin] = field(default_factory=list)  # every record folded in
    types: dict[str, str] = field(default_factory=dict)  # every column seen, in order
    key: list[str] = field(default_factory=list)  # the key's columns, from the events
    last_types: Mapping[str, str] | None = None  # the last event's types, already merged

    def elements(self) -> bytes:
        return b"[" + b",".join(c.element() for c in self.changes.values()) + b"]"

    def filler_elements(self) -> bytes:
        return b"[" + b",".join(c.element() for c in self.fillers.values()) + b"]"


@dataclass
class Batch:
    """What one write applies (a :class:`~shared.interfaces.SinkBatch`)."""

    tables: dict[Source, TableBatch] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0

    def __len__(self) -> int:
        return sum(len(t.changes) for t in self.tables.values())

    def clear(self) -> None:
        self.tables.clear()
        self.records = 0
        self.bytes = 0

    def add(self, source: Source, ev: EventView, origin: Origin) -> None:
        """Fold in a data event (decoded and validated by the event contract)."""
        self.records += 1
        self.bytes += len(origin.value)
        tb = self.tables.get(source)
        if tb is None:
            tb = self.tables[source] = TableBatch()
        tb.origins.append(origin)
        key = ev.key
        row_id = ev.row_id() if ev.append_only is True else None
        if row_id is not None:  # an insert-only table's row: keyed by its row id
            key = {ROW_ID: row_id}
        if not tb.key:
            tb.key = list(key)
        types: Mapping[str, str] = ev.column_types()
        if types is not tb.last_types:  # the same mapping, event after event, mostly
            tb.last_types = types
            if types.keys() - tb.types.keys():
                tb.types.update((c, t) for c, t in types.items() if c not in tb.types)
            if row_id is not None:
                tb.types.pop(ROW_ID, None)
                tb.types[ROW_ID] = "text"  # last, after every column the rows carried
        delete = ev.op == "delete"
        unchanged = None if delete else ev.unchanged_toast or None
        change = Change(
            version=ev.version(),
            delete=delete,
            row=orjson.dumps(key) if delete else bytes(ev.new),
            unchanged=list(unchanged) if unchanged else None,
            hash=None if delete else ev.hash,
            xid=ev.xid if type(ev.xid) is int else 0,
            new=ev.op == "read" or ev.op == "insert",
        )
        if row_id is not None and not delete:
            change.row = with_row_id(change.row, row_id)
        ident = orjson.dumps(key, option=orjson.OPT_SORT_KEYS)
        held = tb.changes.get(ident)
        if held is None:
            tb.changes[ident] = change
            return
        if change.version >= held.version:  # in the stream's order: held was the key's state
            if change.unchanged and not held.delete:
                change = _filled(change, held)
            tb.changes[ident] = change
            return
        if not held.unchanged or change.delete:
            return  # older, and nothing it could fill: stale
        filler = tb.fillers.get(ident)
        if filler is None or change.version >= filler.version:
            if filler is not None and change.unchanged:
                change = _filled(change, filler)
            tb.fillers[ident] = change
        elif filler.unchanged:
            tb.fillers[ident] = _filled(filler, change)


def with_row_id(row: bytes, row_id: str) -> bytes:
    """A row's JSON object with :data:`ROW_ID` added last (``row_id`` is digits, dots and
    an ``s``: nothing to escape)."""
    tail = b'"%s":"%s"}' % (ROW_ID.encode(), row_id.encode())
    body = row.rstrip()[:-1].rstrip()
    return body + (tail if body.endswith(b"{") else b"," + tail)


def _filled(partial: Change, other: Change) -> Change:
    """``partial`` with the unchanged TOAST columns ``other`` carries in full."""
    theirs = _decode_row(other.row)
    missing = set(other.unchanged or ())
    carried = [c for c in partial.unchanged or () if c in theirs and c not in missing]
    if not carried:
        return partial
    row = _decode_row(partial.row)
    for c in carried:
        row[c] = theirs[c]
    rest = [c for c in partial.unchanged or () if c not in carried]
    return msgspec.structs.replace(partial, row=_encode(row), unchanged=rest or None)
