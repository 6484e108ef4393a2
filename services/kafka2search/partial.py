"""Rows that lack columns: unchanged TOAST values the batch did not have, filled from the
index, and what neither had, filled later by an older row
(:func:`shared.contract.event.fill_unfilled`: a sink never refuses a full row in favour
of a partial one).

Both steps read stored documents through ``read`` (the indexer's retried ``mget``) and
run on the writer thread, before and after a bulk write; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from services.kafka2search.documents import Doc
from services.kafka2search.engines import Stored
from services.kafka2search.mapping import ROW_BODY
from shared.contract.event import ROW_HASH, ROW_XID, UNFILLED, fill_unfilled

Read = Callable[[str, list[str], list[str] | None], dict[str, Stored]]
"""The stored documents of ``ids`` in an index (those that exist; with a list of fields,
only those of their source), retried as any engine call: an error raised is the write's
failure."""


def _by_index(docs: list[Doc]) -> dict[str, list[Doc]]:
    groups: dict[str, list[Doc]] = {}
    for d in docs:
        groups.setdefault(d.index, []).append(d)
    return groups


def fill_from_stored(docs: list[Doc], read: Read) -> int:
    """Fill each document's ``missing_toast`` columns from its stored document (one read
    per index, for the documents that need it), else from an older row of the batch
    (``fallback``: the stored document holds every change before the partial one, an
    older row may not). A column neither has (no such document, or one held unfilled)
    is recorded in the row under :data:`~shared.contract.event.UNFILLED`. Returns how
    many documents are written with unfilled columns."""
    unfilled_docs = 0
    for index, group in _by_index([d for d in docs if d.missing_toast]).items():
        stored = read(index, [d.id for d in group], None)
        for d in group:
            held = stored.get(d.id)
            src = held.source if held is not None else {}
            fallback = d.fallback or {}
            row = d.row()
            unfilled: list[str] = []
            for column in d.missing_toast:
                if column in src:
                    row[column] = src[column]
                elif column in fallback:
                    row[column] = fallback[column][1]
                else:
                    unfilled.append(column)
            d.fallback = None
            if unfilled:
                row[UNFILLED] = unfilled
                unfilled_docs += 1
            d.missing_toast = ()
    return unfilled_docs


def fills(refused: list[Doc], read: Read) -> list[Doc]:
    """Of the rows the engine refused as older than the document it holds (409), those
    whose values fill columns the held document lacks: each becomes a write of the held
    document, completed, at the version it has (``fill``: written ``external_gte``). The
    others are stale: the caller counts them."""
    out: list[Doc] = []
    for index, group in _by_index(refused).items():
        # Most refused rows are merely stale: first only the marker, then the documents
        # that have one, whole.
        marked = read(index, [d.id for d in group], [UNFILLED])
        group = [d for d in group if d.id in marked and marked[d.id].source.get(UNFILLED)]
        stored = read(index, [d.id for d in group], None) if group else {}
        for d in group:
            held = stored.get(d.id)
            unfilled = held.source.get(UNFILLED) if held is not None else None
            if held is None or not isinstance(unfilled, list) or not unfilled:
                continue
            try:
                older = d.row()
            except orjson.JSONDecodeError:
                continue  # nothing to take from it
            lacking = older.get(UNFILLED)
            source = dict(held.source)
            rest = fill_unfilled(
                source, unfilled, older, lacking if isinstance(lacking, list) else []
            )
            if len(rest) == len(unfilled):
                continue
            if rest:
                source[UNFILLED] = rest
            else:
                del source[UNFILLED]
            doc = Doc(index, d.id, False, held.version, source, (), d.origin, fill=True)
            out.append(_restamped(doc, held.intact))
    return out


def _restamped(doc: Doc, intact: bool | None) -> Doc:
    """A fill keeps the held version's hash and transaction, taken out of the held source
    so that the document is stamped anew for what it now holds
    (:mod:`services.kafka2search.stamps`) — unless another writer had changed it
    (``intact`` False): then its old, broken stamp stays."""
    source = doc.source
    assert isinstance(source, dict)
    xid = source.pop(ROW_XID, None)
    row_hash = source.pop(ROW_HASH, None)
    body = source.pop(ROW_BODY, None)
    if isinstance(xid, int):
        doc.xid = xid
        doc.row_hash = row_hash if isinstance(row_hash, int) else None
        doc.body = body if intact is False and isinstance(body, int) else None
    return doc
