"""Key ranges of a table, as a snapshot of key ranges names them (``repair``: docs/design.md,
"Repair"): the one place their shape is decided and checked.

A snapshot of key ranges reads only the rows whose key lies in some range, and its end
marker (``op: snapshot``, ``phase: range_end``) carries those ranges: every row the
source holds in them was delivered with a version at least the marker's, so a sink
removes the rows it holds **in those ranges** older than that — and nothing outside them.

Shape (the marker's ``snapshot.key_ranges``, the signal table's ``key_ranges``)::

    {"columns": ["aid"], "ranges": [[lower, upper], ...]}

- ``columns``: the table's key columns, in the key's order;
- each range holds the keys ``lower < key <= upper`` in the key's order (the tuple's: the
  first column, then the next among equals); a bound is ``null`` (unbounded) or an array
  of one value per key column;
- a value is an integer (the key column is ``smallint``, ``integer`` or ``bigint``) or a
  string: a UUID's canonical text (lower-case hex, ``8-4-4-4-12``: a ``uuid`` column), a
  ``text`` / ``varchar`` / ``char(n)`` key's value, or a ``date`` / ``timestamp`` /
  ``timestamptz`` key's text as events write it (V023;
  :func:`shared.contract.keyorder.key_text`). Strings are ordered by their code points — UTF-8's
  byte order, which a search engine's keyword and Spark's strings share, and Postgres
  with ``COLLATE "C"`` (:mod:`shared.contract.keyorder`): a range read by one order and
  swept by another would remove rows the snapshot never read, so no other order is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

MAX_RANGES = 10_000  # ranges one request (one end marker) may carry
MAX_KEY = 2**63 - 1
MAX_TEXT = 8191  # characters of a string key value (a search engine's keyword holds that many)

KeyValue = int | str
Bound = tuple[KeyValue, ...]


class KeyRangesJson(TypedDict):
    """``snapshot.key_ranges`` of a ``range_end`` marker, as JSON gives it."""

    columns: list[str]
    ranges: list[list[list[KeyValue] | None]]


@dataclass(frozen=True)
class KeyRanges:
    """Checked key ranges: ``columns`` and ``(lower, upper)`` pairs, lower excluded, upper
    included, None unbounded."""

    columns: tuple[str, ...]
    ranges: tuple[tuple[Bound | None, Bound | None], ...]

    def as_json(self) -> KeyRangesJson:
        return {
            "columns": list(self.columns),
            "ranges": [[None if b is None else list(b) for b in r] for r in self.ranges],
        }


def parse(obj: Any) -> KeyRanges:
    """``obj`` checked against the shape above; ValueError saying what is wrong."""
    if type(obj) is not dict:
        raise ValueError("'key_ranges' is not an object")
    columns = obj.get("columns")
    if (
        type(columns) is not list
        or not columns
        or not all(type(c) is str and c for c in columns)
        or len(set(columns)) != len(columns)
    ):
        raise ValueError("'key_ranges.columns' is not a list of distinct column names")
    ranges = obj.get("ranges")
    if type(ranges) is not list or not 0 < len(ranges) <= MAX_RANGES:
        raise ValueError(f"'key_ranges.ranges' is not a list of 1 to {MAX_RANGES} ranges")
    out: list[tuple[Bound | None, Bound | None]] = []
    for r in ranges:
        if type(r) is not list or len(r) != 2:
            raise ValueError("a key range is not a [lower, upper] pair")
        lower, upper = (_bound(b, len(columns)) for b in r)
        out.append((lower, upper))  # lower >= upper: an empty range, which selects nothing
    return KeyRanges(tuple(columns), tuple(out))


def _bound(b: Any, width: int) -> Bound | None:
    if b is None:
        return None
    if type(b) is not list or len(b) != width:
        raise ValueError(f"a key range's bound is not null or a list of {width} key value(s)")
    for v in b:
        if type(v) is int:
            if not -MAX_KEY - 1 <= v <= MAX_KEY:
                raise ValueError(f"key value {v} outside a bigint")
        elif type(v) is str:
            if len(v) > MAX_TEXT:
                raise ValueError(f"key value {v[:60]!r}... is longer than {MAX_TEXT} characters")
            if "\x00" in v:
                raise ValueError(f"key value {v[:60]!r} holds a NUL character (no text does)")
        else:
            raise ValueError(f"key value {str(v)[:60]!r} is neither an integer nor a string")
    return tuple(b)


__all__ = ["MAX_RANGES", "Bound", "KeyRanges", "KeyRangesJson", "KeyValue", "parse"]
