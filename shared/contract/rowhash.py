"""The row hash: one number per row version, computed by pg2kafka from the text values it
decodes and by Postgres itself in SQL, so that a sink can be compared with its source
without reading every row out of either (``verify``: docs/design.md#verification).

Definition (the one place it lives; pg2kafka's compiled path implements it again in
``services/pg2kafka/native/src/rowhash.rs``, held to this one by a test):

* the columns are those the stream carries (not dropped, not generated), with their
  **text output** under the session settings of :data:`TEXT_OUTPUT_OPTIONS` — what
  pgoutput sends, what ``COPY`` writes, what SQL's ``concat()`` produces;
* columns whose value is NULL are left out, so a column added without a default changes
  no row's hash;
* the others are taken in the order of their names' UTF-8 bytes (not their position: a
  column's place in the table does not matter), each written as two netstrings,
  ``<bytes of name>:<name><bytes of value>:<value>``, one after the other;
* the hash is the first four bytes of the MD5 of that string, as an unsigned big-endian
  integer: 0 <= hash < 2**32.

MD5 is not a security measure here (a sink's operator can write anything into it); it is
a checksum every Postgres has built in. A range of rows compares by its count and the sum
of its hashes (order-independent; exact in a double up to 2**21 rows of 32-bit hashes,
which is why :data:`MAX_RANGE_ROWS` bounds a range). Two different row sets of a range
agree by chance with a probability of about 2**-32.

A row version whose text pg2kafka does not hold entirely — an update that left an
unchanged TOAST value out — has no hash (``None``): sinks record it as unknown and
``verify`` compares that row by reading it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final

from psycopg import sql

HASH_BITS: Final = 32
MAX_RANGE_ROWS: Final = 1 << 21
"""The most rows one range's hash sum covers: 2**21 hashes below 2**32 sum below 2**53, a
double's exact range (the search engines sum in doubles)."""

TEXT_OUTPUT_OPTIONS: Final = (
    "-c DateStyle=ISO,YMD -c TimeZone=UTC -c IntervalStyle=iso_8601 "
    "-c extra_float_digits=3 -c bytea_output=hex"
)
"""The settings that fix every type's text output: pg2kafka's replication and snapshot
connections and every ``verify`` session use them (``money`` follows ``lc_monetary``:
the Debezium format adds ``lc_monetary=C`` to both)."""


def _netstring(data: bytes) -> bytes:
    return b"%d:%s" % (len(data), data)


def hash_input(columns: Iterable[tuple[str, str | None]]) -> bytes:
    """The string the row hash is the MD5 of (see the module's definition)."""
    parts = sorted((name.encode(), value.encode()) for name, value in columns if value is not None)
    return b"".join(_netstring(n) + _netstring(v) for n, v in parts)


def row_hash(columns: Iterable[tuple[str, str | None]]) -> int:
    """The row hash of ``(column name, text value or None for NULL)`` pairs."""
    digest = hashlib.md5(hash_input(columns), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big")


def row_hash_sql(columns: Sequence[str], qualifier: str | None = None) -> sql.Composed:
    """The SQL expression of the row hash over ``columns`` (bigint, never NULL): the same
    number :func:`row_hash` gives for the row's text output. ``qualifier``: a table alias
    to prefix the columns with. Identifiers are quoted; names never become code."""
    pieces: list[sql.Composable] = []
    for name in sorted(columns, key=lambda n: n.encode()):
        col: sql.Composable = sql.Identifier(qualifier, name) if qualifier else sql.Identifier(name)
        prefix = _netstring(name.encode()).decode()
        # concat() writes a value by its type's output function (the text pgoutput sends;
        # a cast to text would not: bool, inet and char(n) cast differently).
        pieces.append(
            sql.SQL(
                "CASE WHEN {c} IS NULL THEN '' ELSE concat({p}, octet_length(concat({c})),"
                " ':', {c}) END"
            ).format(c=col, p=sql.Literal(prefix))
        )
    body = sql.SQL(", ").join(pieces) if pieces else sql.SQL("''")
    return sql.SQL("('x' || left(md5(concat({})), 8))::bit(32)::bigint").format(body)
