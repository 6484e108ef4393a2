"""Rows older than a column's rename or drop, met after the sink applied it (kafka2search's
indices, kafka2postgres's tables; the text below speaks of an index).

Under primary-key partitioning each partition carries its own copy of a schema change,
and the index applies the first copy it meets (``Indexer.ddl``). A row changed *before*
that change, read later from a lagging partition (or read again after a restart), still
carries the column's old name: indexed as it is, it would bring the old field back and
leave the new one empty. The index keeps every rename and drop it applied, with its
version, in ``_meta`` (``moves``: ``[old, new or None, version]`` in the order applied);
a row older than a move gets it on the way in — renamed, or the column left out — as the
documents already in the index got it from the DDL itself.

A snapshot's ``read`` row is the exception to "older by version is older in schema": its
version is the slot's restart position minus one (docs/events.md), usually below schema
changes its read already saw. Its ``types`` are the table's columns when it was read, so:

- a rename ``old → new`` is applied only to a row that has no column ``new`` (any row
  with both was written after the rename: a column named ``old`` was added again);
- a drop of a column a read row still has is applied only when the index holds no column
  of that name again: a name dropped and added again keeps the read's value (it may be
  the new column's; the other reading would lose it).

A delete carries no row, only column types; they are moved too, or they would map the
old name again (see :meth:`~services.kafka2search.indices.Indices.index_for`).

Translation never fails a record: a row that is no JSON object is handed on unchanged,
and the batch reports it as unreadable as it would any other.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.contract.event import EventView

Move = tuple[str, str | None, int]

_decode_row = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_encode = msgspec.json.encode


@dataclass(frozen=True)
class Moves:
    """The moves of one index, parsed once (``latest``: the newest move's version, so a
    row at or above it — nearly every row — is recognised with one comparison)."""

    items: tuple[Move, ...]
    latest: int

    @classmethod
    def of(cls, meta: dict[str, Any]) -> Moves:
        items = tuple(
            (str(old), None if new is None else str(new), int(at))
            for old, new, at in meta.get("moves") or []
        )
        return cls(items, max((at for _o, _n, at in items), default=0))


def record(meta: dict[str, Any], renames: list[tuple[str, str]], drops: list[str], at: int) -> None:
    """Add a schema change's renames and drops (applied at version ``at``) to ``meta``."""
    if not renames and not drops:
        return
    moves = list(meta.get("moves") or [])
    moves += [[old, new, at] for old, new in renames] + [[old, None, at] for old in drops]
    meta["moves"] = moves


def translate(ev: EventView, moves: Moves, held: Container[str] = ()) -> EventView:
    """``ev`` with every move newer than it applied to its row, types and unchanged
    TOAST columns; ``ev`` itself when none concerns it. ``held``: the columns the index
    maps now (decides a read row's drops, see the module's text)."""
    if not moves.items:
        return ev
    # A delete too: it has no row, but its column types would map the old name again
    # (seen: one delete mapped a dropped column back, and every read row after it then
    # kept the column as one added again).
    version = ev.version()
    if version >= moves.latest:
        return ev
    try:
        types = dict(ev.column_types())
    except (msgspec.DecodeError, ValueError):
        return ev  # the batch reports it
    due: list[tuple[str, str | None]] = []
    for old, new, at in moves.items:
        if version >= at or old not in types:
            continue
        if new is None:
            if ev.op == "read" and old in held:
                continue
            del types[old]
        else:
            if new in types:
                continue
            types[new] = types.pop(old)
        due.append((old, new))
    if not due:
        return ev
    row: dict[str, msgspec.Raw] | None = None
    toast: list[str] = []
    try:
        if ev.new and bytes(ev.new) != b"null":  # a delete's is null
            row = _decode_row(bytes(ev.new))
        if ev.unchanged_toast:
            toast = msgspec.convert(ev.unchanged_toast, list[str])
    except (msgspec.DecodeError, RecursionError):
        return ev  # not a row walcast can move: the batch reports it
    for old, new in due:
        if row is not None and old in row:
            value = row.pop(old)
            if new is not None:
                row[new] = value
        if old in toast:
            toast = [c for c in toast if c != old] + ([new] if new is not None else [])
    return msgspec.structs.replace(
        ev,
        types=msgspec.Raw(_encode(types)),
        new=msgspec.Raw(_encode(row)) if row is not None else ev.new,
        unchanged_toast=toast or None,
    )
