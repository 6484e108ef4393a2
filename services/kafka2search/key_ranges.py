"""Key ranges as a search query: the documents whose key lies in a range, in the key's order
(the tuple's: the first column, then the next among equals). ``verify`` summarises and reads
ranges with it; a snapshot of key ranges' end marker removes old documents within them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from shared.contract.keyranges import KeyRanges

Bound = tuple[object, ...]


def range_query(columns: Sequence[str], lower: Bound | None, upper: Bound | None) -> dict[str, Any]:
    """The documents whose key is in (``lower``, ``upper``] (None: unbounded); ``columns``:
    the fields of the key's columns (a text column's keyword: strings compare by code
    point, the order :mod:`shared.contract.keyorder` decides)."""
    parts: list[dict[str, Any]] = []
    if lower is not None:
        parts.append(_beyond(columns, lower, "gt"))
    if upper is not None:
        parts.append(_beyond(columns, upper, "lte"))
    if not parts:
        return {"match_all": {}}
    return {"bool": {"filter": parts}}


def ranges_query(ranges: KeyRanges, fields: Sequence[str] | None = None) -> dict[str, Any]:
    """The documents whose key is in any of ``ranges``; ``fields``: the key columns' fields
    (:func:`~services.kafka2search.mapping.key_field`; default: the columns' names)."""
    names = ranges.columns if fields is None else fields
    return {
        "bool": {
            "should": [range_query(names, lo, hi) for lo, hi in ranges.ranges],
            "minimum_should_match": 1,
        }
    }


def _json(v: object) -> object:
    return str(v) if isinstance(v, uuid.UUID) else v


def _beyond(columns: Sequence[str], bound: Bound, last: str) -> dict[str, Any]:
    """key > bound (``last`` gt) or key <= bound (lte), lexicographically: the first
    column strictly beyond, or equal and the rest so."""
    strict = "gt" if last == "gt" else "lt"
    (c, *rest), (v, *more) = columns, bound
    if not rest:
        return {"range": {c: {last: _json(v)}}}
    return {
        "bool": {
            "should": [
                {"range": {c: {strict: _json(v)}}},
                {"bool": {"filter": [{"term": {c: _json(v)}}, _beyond(rest, tuple(more), last)]}},
            ],
            "minimum_should_match": 1,
        }
    }
