"""What a DDL event says about a table's columns, read the same way by every consumer.

A rename is a column that kept its number (``num``, Postgres's ``attnum``, which DDL
events carry since pg2kafka's V009 migration) under a new name: read from the event's
structure, not from its statement text (``current_query()`` holds everything the client
sent at once: a migration renaming one column and dropping another once moved one
column's data into the other). Only when the numbers are not known on both sides (an
older producer, or a sink that has not seen the table's numbers yet) does the statement
count, and then only a ``RENAME [COLUMN] old TO new`` whose ``old`` is among the removed
columns and ``new`` among the added ones.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

_RENAME_COLUMN = re.compile(
    r'\bRENAME\s+(?:COLUMN\s+)?("(?:[^"]|"")+"|[^\s;,]+)\s+TO\s+("(?:[^"]|"")+"|[^\s;,]+)',
    re.IGNORECASE,
)


def column_numbers(columns: object) -> dict[str, int]:
    """``name -> num`` of a DDL event's ``columns`` ({} when the producer sent none)."""
    if not isinstance(columns, list):
        return {}
    return {
        str(c["name"]): c["num"]
        for c in columns
        if isinstance(c, dict) and "name" in c and type(c.get("num")) is int
    }


def renames(
    removed: Collection[str],
    added: Collection[str],
    known: Mapping[str, int],
    numbers: Mapping[str, int],
    statement: str,
) -> list[tuple[str, str]]:
    """The ``(old, new)`` column renames a DDL event makes. ``removed`` / ``added``: the
    sink's columns gone from / new in the event's schema; ``known``: the numbers the sink
    recorded before; ``numbers``: the event's (:func:`column_numbers`)."""
    if known and numbers:
        by_number = {n: name for name, n in numbers.items()}
        return [
            (old, by_number[known[old]])
            for old in removed
            if old in known and by_number.get(known[old]) in added
        ]
    for m in _RENAME_COLUMN.finditer(statement):
        old, new = _ident(m.group(1)), _ident(m.group(2))
        if old in removed and new in added:
            return [(old, new)]
    return []


def _ident(token: str) -> str:
    """A Postgres identifier as the catalog holds it: quoted as written, else lower-cased."""
    if token.startswith('"') and token.endswith('"'):
        return token[1:-1].replace('""', '"')
    return token.lower()
