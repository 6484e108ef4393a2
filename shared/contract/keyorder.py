"""The one order of keys that Postgres, the search engines and Spark share, and how to ask
Postgres for it: what ``verify`` ranges and a snapshot of key ranges
(:mod:`shared.contract.keyranges`) are cut by.

- Integers (``smallint``, ``integer``, ``bigint``) by value and ``uuid`` by its bytes (its
  canonical text's order) order alike everywhere.
- ``text`` and ``varchar`` order by code point — UTF-8's byte order: a search engine's
  keyword, Spark's and Delta's strings, Python's ``str``. Postgres orders them so under a
  collation that compares bytes (``C``, ``POSIX``, ``C.UTF-8`` of libc, any of the builtin
  provider's); under any other (``en_US.UTF-8``, an ICU collation) its order differs, and
  every comparison of such a column is written with ``COLLATE "C"``. Postgres walks that
  order by an index only if one sorts the column so — ``verify`` asks for one
  (:func:`c_index_statement`) rather than sort the table once per range.
- ``bpchar`` (``char(n)``) orders in Postgres without its trailing blanks; the sinks hold
  it blank-padded. The two orders agree unless a value holds a character below the blank
  (a control character): it is compared ``COLLATE "C"`` as text is, and a range holding
  such a key is not verified (:func:`sortable_sql`).
- ``date``, ``timestamp`` and ``timestamptz`` are compared by their text as events carry
  it (:func:`key_text`: ISO-8601, ``T``, a fraction without trailing zeros, ``+00:00``),
  whose code point order is the time order for years 1 to 9999 — a search engine's
  ``date`` field keeps milliseconds only, so its key columns' raw text is indexed beside
  it (``<column>.key``). A range holding a key outside those years (``infinity``, a year
  BC or beyond 9999) is not verified (:func:`sortable_sql`).
- Anything else (numeric — exact in Postgres, doubles in a search engine —, ``citext``,
  ``time``...) has no order all three share: such keys are refused, with why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import psycopg
from psycopg import sql

from shared.errors import PermanentError

INTEGER_KEY_TYPES = frozenset({"int2", "int4", "int8"})
TEXT_KEY_TYPES = frozenset({"text", "varchar", "bpchar"})
TIME_KEY_TYPES = frozenset({"date", "timestamp", "timestamptz"})
ORDERED_KEY_TYPES = INTEGER_KEY_TYPES | TEXT_KEY_TYPES | TIME_KEY_TYPES | {"uuid"}
"""Key column types (``pg_type.typname``) whose order Postgres, the engines and Spark share
(within the bounds :func:`sortable_sql` checks)."""

_TIME_TEXT = re.compile(r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:\+00(?::00)?)?)?")


def key_text(value: object) -> str:
    """A ``date`` / ``timestamp`` / ``timestamptz`` key value as events carry it, whatever
    it was read as: a :class:`~datetime.date`, a :class:`~datetime.datetime` (an aware one
    in UTC), or Postgres's text output (``DateStyle=ISO``, ``TimeZone=UTC``). Text of
    another form (``infinity``, a year BC) is returned as it is: :func:`sortable_sql`
    keeps such keys out of every comparison."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        frac = f".{value.microsecond:06d}".rstrip("0").rstrip(".")
        return (
            f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:"
            f"{value.minute:02d}:{value.second:02d}{frac}"
            + ("+00:00" if value.tzinfo is not None else "")
        )
    if isinstance(value, date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    text = str(value)
    if _TIME_TEXT.fullmatch(text) is None:
        return text
    text = text.replace(" ", "T", 1)
    return text + ":00" if text.endswith("+00") else text


def sortable_sql(column: sql.Composable, pg_type: str) -> sql.Composable | None:
    """A condition true of a key value whose order every side shares (None: all are):
    a time in years 1 to 9999, a ``bpchar`` without a character below the blank."""
    if pg_type in TIME_KEY_TYPES:
        return sql.SQL("({c} >= '0001-01-01' AND {c} < '10000-01-01')").format(c=column)
    if pg_type == "bpchar":
        return sql.SQL(r"({c} !~ '[\x01-\x1f]')").format(c=column)
    return None


_BYTE_ORDER_LOCALES = frozenset({"C", "POSIX", "C.UTF-8", "C.utf8"})
_C_COLLATIONS = frozenset({950, 951})  # pg_collation "C" and "POSIX"


@dataclass(frozen=True)
class KeyColumn:
    """A key column: its name, ``pg_type.typname``, number, and whether comparing it in
    the shared order needs ``COLLATE "C"`` (a text column under another collation)."""

    name: str
    type: str
    attnum: int
    collate_c: bool = False


def key_columns(
    conn: psycopg.Connection[Any], table_oid: int, attnums: Sequence[int]
) -> list[KeyColumn]:
    """The columns ``attnums`` of the table, in that order, each with whether it needs
    ``COLLATE "C"``. The database's own collation decides for a column of the default
    collation (its provider read through ``to_jsonb``: the column exists from Postgres 15)."""
    rows = conn.execute(
        "SELECT a.attnum, a.attname, t.typname, a.attcollation::int,"
        " coalesce(co.collprovider::text, to_jsonb(d) ->> 'datlocprovider', 'c'),"
        " coalesce(co.collcollate, d.datcollate)"
        " FROM pg_catalog.pg_attribute a"
        " JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
        " CROSS JOIN pg_catalog.pg_database d"
        " LEFT JOIN pg_catalog.pg_collation co"
        "   ON co.oid = a.attcollation AND a.attcollation <> 100"
        " WHERE a.attrelid = %s AND a.attnum = ANY(%s)"
        " AND d.datname = pg_catalog.current_database()",
        [table_oid, list(attnums)],
    ).fetchall()
    by_num = {int(r[0]): r for r in rows}
    out = []
    for num in attnums:
        _n, name, typ, coll, provider, locale = by_num[int(num)]
        needs = str(typ) in TEXT_KEY_TYPES and not byte_ordered(int(coll), provider, locale)
        out.append(KeyColumn(str(name), str(typ), int(num), needs))
    return out


def byte_ordered(collation: int, provider: str | None, locale: str | None) -> bool:
    """Whether a collation (its oid, provider and ``collcollate`` / the database's
    ``datcollate`` for the default) compares text by code point."""
    if collation in _C_COLLATIONS:
        return True
    if provider == "b":  # the builtin provider (Postgres 17): C, C.UTF-8, PG_UNICODE_FAST
        return True
    return provider == "c" and locale in _BYTE_ORDER_LOCALES


def key_expr(column: sql.Composable, collate_c: bool) -> sql.Composable:
    """A key column as every comparison and ``ORDER BY`` of the shared order writes it."""
    return sql.SQL('{} COLLATE "C"').format(column) if collate_c else column


def has_c_index(conn: psycopg.Connection[Any], table_oid: int, key: Sequence[KeyColumn]) -> bool:
    """Whether a valid, whole-table index leads with the key's columns, in order, sorting
    each column that needs it by ``C``: Postgres then walks the shared order by it."""
    rows = conn.execute(
        "SELECT i.indkey::text, i.indcollation::text FROM pg_catalog.pg_index i"
        " WHERE i.indrelid = %s AND i.indisvalid AND i.indpred IS NULL",
        [table_oid],
    ).fetchall()
    for keys, colls in rows:
        nums = [int(x) for x in str(keys).split()]
        collations = [int(x) for x in str(colls).split()]
        if len(nums) < len(key):
            continue
        if all(
            nums[i] == col.attnum and (not col.collate_c or collations[i] in _C_COLLATIONS)
            for i, col in enumerate(key)
        ):
            return True
    return False


def c_index_statement(table: tuple[str, str], key: Sequence[KeyColumn]) -> str:
    """The index that gives Postgres the shared order of ``key`` (a hint's text)."""
    cols = ", ".join(
        sql.Identifier(c.name).as_string(None) + (' COLLATE "C"' if c.collate_c else "")
        for c in key
    )
    return f"CREATE INDEX CONCURRENTLY ON {sql.Identifier(*table).as_string(None)} ({cols})"


def named_key_columns(
    conn: psycopg.Connection[Any], table: tuple[str, str], names: Sequence[str]
) -> list[KeyColumn]:
    """:func:`key_columns` of the table's columns named ``names`` (a key as events name it)."""
    rows = conn.execute(
        "SELECT a.attrelid::int, a.attname, a.attnum FROM pg_catalog.pg_attribute a"
        " WHERE a.attrelid = %s::text::pg_catalog.regclass AND a.attname = ANY(%s)"
        " AND NOT a.attisdropped",
        [sql.Identifier(*table).as_string(conn), list(names)],
    ).fetchall()
    by_name = {str(r[1]): int(r[2]) for r in rows}
    missing = [n for n in names if n not in by_name]
    if missing or not rows:
        raise PermanentError(
            f"{'.'.join(table)} has no key column(s) {missing} (changed while read?)",
            hint="request the snapshot of key ranges again",
        )
    return key_columns(conn, int(rows[0][0]), [by_name[n] for n in names])
