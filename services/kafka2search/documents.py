"""Change events into search documents: per-batch reduction, bulk bodies.

A row of an insert-only table (``append_only``) is a document of its own, under its row
id (:func:`~services.kafka2search.mapping.document_id`): written once, versioned like any
document, so a redelivery is refused as stale (409) instead of duplicating it.

A batch keeps, per document, only the newest change (highest LSN; on a tie the later
one): the index ends up the same, the bulk is smaller. An update whose ``unchanged_toast``
columns were left out takes them from the change before it in the batch when it has them;
the rest are filled from the stored document before writing (``missing_toast``), so an
unchanged TOAST value is never erased. Only what the stored document lacks too is taken
from a row at an older version that came after the update (a snapshot's read row, a
redelivery: ``fallback``), and what none had is recorded in the document as unfilled,
for an older row to fill later (:func:`shared.contract.event.fill_unfilled`).

This is the service's hot path (every record passes through it), so a row is never
decoded, nor even copied: the contract's :class:`~shared.contract.event.EventView` keeps
``new`` as the raw JSON pg2kafka wrote (a view into the record's bytes), and that becomes
the document's ``_source`` line in the bulk body as is. Only a change whose unchanged
TOAST values must be merged in, or a record with a line break in it (pg2kafka writes
none), is decoded and encoded again.

Records are decoded and validated by the event contract
(:func:`shared.contract.event.decode`) before they get here. Nothing here talks to Kafka
or the engine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from services.kafka2search.mapping import document_id
from services.kafka2search.stamps import stamped
from shared.contract import limits
from shared.contract.event import EventDecodeError, EventView, checked_row_id
from shared.interfaces import Origin, Rejection


def _as_dict(source: msgspec.Raw | dict[str, Any]) -> dict[str, Any]:
    if isinstance(source, dict):
        return source
    row: dict[str, Any] = orjson.loads(bytes(source))
    return row


_row_id = checked_row_id  # the contract's check (shared/contract/event.py)


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
    # Written at the version the engine holds (``external_gte``): an older row's values
    # filling a held document's unfilled columns (:func:`shared.contract.event.fill_unfilled`).
    fill: bool = False
    # Values of ``missing_toast`` columns from rows of the batch at an older version that
    # came after this change (a snapshot's read row, a redelivery): column -> (version,
    # value). Used only where the stored document lacks the column: the stored one holds
    # every change before this one (per-key order), an older row may predate some of
    # them — even the table's re-creation.
    fallback: dict[str, tuple[int, Any]] | None = None
    # The verify fields of the version written (docs/design.md#verification): the row
    # hash (None: unknown, left out) and the writing transaction (0: a read row), put
    # first in the source line with the document's stamp (services/kafka2search/stamps.py).
    # ``xid`` None: no fields — a delete, or a row of a format without them.
    row_hash: int | None = None
    xid: int | None = None
    # A stamp value kept instead of the CRC: a held document another writer changed,
    # rewritten by a fill, stays seen as changed (services/kafka2search/stamps.py).
    body: int | None = None

    def row(self) -> dict[str, Any]:
        """The source decoded, and kept so (for merging values into it)."""
        assert self.source is not None
        row = self.source = _as_dict(self.source)
        return row


class Pending:
    """A batch's write as later batches see it: whether it holds rows that lack unchanged
    TOAST columns, and whether it finished (successfully or not)."""

    __slots__ = ("partial", "written")

    def __init__(self) -> None:
        self.partial = False
        self.written = threading.Event()


@dataclass
class Batch:
    """Documents reduced from the data events in hand, and the size of what they came
    from (the budget is on consumed bytes, which is what memory holds)."""

    docs: dict[tuple[str, str], Doc] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0
    toast: int = 0  # documents added with unchanged TOAST columns (an upper bound after merges)
    reads: int = 0  # snapshot read rows: older than changes before them, maybe filling them
    # This batch's write, and the unwritten batches handed over before it (set by the
    # indexer: the order of partial rows and the older rows that fill them, across the
    # writes that overlap — services/kafka2search/partial.py).
    mark: Pending = field(default_factory=lambda: Pending())
    earlier: list[Pending] = field(default_factory=list)

    def add(self, index: str, ev: EventView, origin: Origin) -> str | None:
        """Fold one insert/update/delete in (a snapshot's read row is an insert); returns a
        reason when it cannot be indexed."""
        self.records += 1
        self.bytes += len(origin.value)
        if ev.op == "read":
            self.reads += 1
        try:
            # A row of an insert-only table: its id from its position (appended once,
            # whatever the redeliveries); any other row: its key.
            doc_id = document_id(ev.key, _row_id(ev)) if ev.append_only else document_id(ev.key)
        except EventDecodeError as exc:
            return f"the key gives no document id: {exc}"
        if doc_id is None:
            return "the table has no primary key or replica identity: no document id"
        lsn: int = ev.version()  # the epoch before the LSN (a new source)
        source: msgspec.Raw | dict[str, Any] | None = None
        missing: tuple[str, ...] = ()
        fallback: dict[str, tuple[int, Any]] | None = None
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
                    self.mark.partial = True
        current = self.docs.get((index, doc_id))
        if current is not None:
            if lsn < current.lsn:
                # older than what the batch holds: stale — but its values may complete a
                # newer change that lacks unchanged TOAST columns (fill_unfilled)
                if current.missing_toast and source is not None:
                    self._complete(current, source, missing, lsn)
                return None
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
                if missing and current.fallback:  # unchanged since: the same fallback
                    fallback = {c: v for c, v in current.fallback.items() if c in missing}
        delete = source is None
        self.docs[(index, doc_id)] = Doc(
            index, doc_id, delete, lsn, source, missing, origin, fallback=fallback or None,
            row_hash=ev.hash if type(ev.hash) is int else None,
            xid=None if delete else (ev.xid if type(ev.xid) is int else 0),
        )  # fmt: skip
        return None

    @staticmethod
    def _complete(
        newer: Doc,
        older: msgspec.Raw | dict[str, Any],
        older_missing: tuple[str, ...],
        older_lsn: int,
    ) -> None:
        """Keep ``older``'s values of the columns ``newer`` still lacks, as its fallback
        (the newest older row's value per column): not merged yet, since the stored
        document may hold a value newer than ``older`` (a redelivered row from before an
        update, or from before the table was dropped and created again)."""
        try:
            row = _as_dict(older)
        except orjson.JSONDecodeError:
            return  # the engine refuses the broken one; nothing to take from it
        fallback = newer.fallback if newer.fallback is not None else {}
        for column in newer.missing_toast:
            usable = column in row and column not in older_missing
            if usable and (column not in fallback or fallback[column][0] < older_lsn):
                fallback[column] = (older_lsn, row[column])
        newer.fallback = fallback or None

    def __len__(self) -> int:
        return self.records

    def clear(self) -> None:
        self.docs.clear()
        self.records = 0
        self.bytes = 0
        self.toast = 0
        self.reads = 0
        self.mark.partial = False


def encode_sources(docs: list[Doc]) -> tuple[list[Doc], list[Rejection]]:
    """Each row that was decoded (to merge unchanged TOAST values into it) encoded again,
    once, after the merge and fill: the documents the bulk body can carry, and those it
    cannot with the reason (the caller dead-letters them; nothing here raises for a
    document). A row nested deeper than orjson's encoder goes (255 levels) is written by
    the standard library's, as deep as :data:`shared.contract.limits.MAX_JSON_DEPTH`;
    deeper, it is refused (the same row without a merge goes to the engine as it came,
    and the engine decides)."""
    ok: list[Doc] = []
    refused: list[Rejection] = []
    for d in docs:
        if isinstance(d.source, dict):
            try:
                d.source = msgspec.Raw(limits.dumps(d.source))
            except EventDecodeError as exc:
                refused.append((d.origin, f"the document cannot be written as JSON: {exc}"))
                continue
        ok.append(d)
    return ok, refused


def bulk_body(docs: list[Doc]) -> bytes:
    """NDJSON for the engine's bulk API: external versioning by the change's version (its
    LSN, after the source's epoch: :meth:`EventView.version`), so an older or
    repeated change is refused (409) instead of overwriting newer data (a ``fill``
    rewrites the version held: ``external_gte``). Rows decoded for
    a merge are encoded by :func:`encode_sources` first (which sets aside those that
    cannot be)."""
    parts: list[bytes | memoryview] = []
    append = parts.append
    dumps = orjson.dumps
    index_json: dict[str, bytes] = {}
    for d in docs:
        index = index_json.get(d.index)
        if index is None:
            index = index_json[d.index] = dumps(d.index)
        # {"<action>":{"_index":…,"_id":…,"version":<lsn>,"version_type":"external"}}
        meta = b'{"_index":%b,"_id":%b,"version":%d,"version_type":"%b"}}' % (
            index,
            dumps(d.id),
            d.lsn,
            b"external_gte" if d.fill else b"external",
        )
        if d.delete:
            append(b'{"delete":' + meta + b"\n")
            continue
        append(b'{"index":' + meta + b"\n")
        src = d.source
        line = src if isinstance(src, msgspec.Raw) else limits.dumps(src)
        if d.xid is None:
            append(line)
            append(b"\n")
            continue
        parts.extend(stamped(line, d.row_hash, d.xid, d.body))
        append(b"\n")
    return b"".join(parts)
