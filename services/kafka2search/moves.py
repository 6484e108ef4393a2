"""Rows older than a column's rename or drop, met after the index applied it.

Under primary-key partitioning each partition carries its own copy of a schema change,
and the index applies the first copy it meets (``Indexer.ddl``). A row changed *before*
that change, read later from a lagging partition (or read again after a restart), still
carries the column's old name: indexed as it is, it would bring the old field back and
leave the new one empty. The index keeps every rename and drop it applied, with its
version, in ``_meta`` (``moves``: ``[old, new or None, version]`` in the order applied);
a row older than a move gets it on the way in — renamed, or the column left out — as the
documents already in the index got it from the DDL itself.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from shared.contract.event import EventView

Move = tuple[str, str | None, int]


def moves_of(meta: dict[str, Any]) -> list[Move]:
    """The moves recorded in an index's ``_meta`` (``[]`` when none)."""
    return [(str(old), None if new is None else str(new), int(at))
            for old, new, at in meta.get("moves") or []]  # fmt: skip


def record(meta: dict[str, Any], renames: list[tuple[str, str]], drops: list[str], at: int) -> None:
    """Add a schema change's renames and drops (applied at version ``at``) to ``meta``."""
    if not renames and not drops:
        return
    moves = list(meta.get("moves") or [])
    moves += [[old, new, at] for old, new in renames] + [[old, None, at] for old in drops]
    meta["moves"] = moves


def translate(ev: EventView, moves: list[Move]) -> EventView:
    """``ev`` with every move newer than it applied to its row, types and unchanged
    TOAST columns; ``ev`` itself when none concerns it (the common case: one comparison
    per move)."""
    version = ev.version()
    due = [(old, new) for old, new, at in moves if version < at]
    if not due or ev.op == "delete":
        return ev
    types = dict(ev.column_types())
    if not any(old in types for old, _ in due):
        return ev
    row: dict[str, Any] | None = orjson.loads(bytes(ev.new)) if ev.new else None
    toast: list[str] = [str(c) for c in ev.unchanged_toast or []]
    for old, new in due:
        if old not in types:
            continue
        kind = types.pop(old)
        if new is not None:
            types.setdefault(new, kind)
        if row is not None and old in row:
            value = row.pop(old)
            if new is not None:
                row.setdefault(new, value)
        if old in toast:
            toast = [c for c in toast if c != old] + ([new] if new is not None else [])
    return msgspec.structs.replace(
        ev,
        types=msgspec.Raw(orjson.dumps(types)),
        new=msgspec.Raw(orjson.dumps(row)) if row is not None else ev.new,
        unchanged_toast=toast or None,
    )
