"""The row hash: one number per row version, computed by pg2kafka from the text values it
decodes and by Postgres itself in SQL, so that a sink can be compared with its source
without reading every row out of either (``verify``: docs/design.md#verification).

Definition (the one place it lives; pg2kafka's compiled path implements it again in
``services/pg2kafka/native/src/rowhash.rs``, held to this one by a test, and Postgres
computes it with :func:`row_hash_sql`):

* the columns are those the stream carries (not dropped, not generated), with their
  **text output** under the session settings of :data:`TEXT_OUTPUT_OPTIONS` — what
  pgoutput sends, what ``COPY`` writes, what SQL's ``concat()`` produces;
* each column whose value is not NULL contributes the 32-bit hash of its name as a
  netstring followed by its text, ``<bytes of name>:<name><text>`` (a column's name is
  fixed, so the value is the rest: unambiguous); a NULL contributes nothing, so a column
  added without a default changes no row's hash, and neither does a column's place;
* that 32-bit hash is Postgres's own ``hashtext`` (Bob Jenkins' lookup3 over the bytes,
  as ``hash_bytes`` computes it on little-endian servers), read as unsigned;
* the row hash is the sum of its columns' hashes modulo 2**32: 0 <= hash < 2**32.

Postgres computes a column's hash with one call of its built-in hash function, cheaper
than its text output is to send: a verification costs Postgres less than a ``COPY`` of
the same rows. This is not a security measure (a sink's operator can write anything); it
is a checksum. A range of rows compares by its count and the sum of its hashes
(order-independent; exact in a double up to 2**21 rows of 32-bit hashes, which is why
:data:`MAX_RANGE_ROWS` bounds a range). Two different row sets of a range agree by chance
with a probability of about 2**-32.

A row version whose text pg2kafka does not hold entirely — an update that left an
unchanged TOAST value out — has no hash (``None``): sinks record it as unknown and
``verify`` compares that row by reading it again.
"""

from __future__ import annotations

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

_M32 = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _M32
    a ^= _rot(c, 4)
    c = (c + b) & _M32
    b = (b - a) & _M32
    b ^= _rot(a, 6)
    a = (a + c) & _M32
    c = (c - b) & _M32
    c ^= _rot(b, 8)
    b = (b + a) & _M32
    a = (a - c) & _M32
    a ^= _rot(c, 16)
    c = (c + b) & _M32
    b = (b - a) & _M32
    b ^= _rot(a, 19)
    a = (a + c) & _M32
    c = (c - b) & _M32
    c ^= _rot(b, 4)
    b = (b + a) & _M32
    return a, b, c


def _final(a: int, b: int, c: int) -> int:
    c ^= b
    c = (c - _rot(b, 14)) & _M32
    a ^= c
    a = (a - _rot(c, 11)) & _M32
    b ^= a
    b = (b - _rot(a, 25)) & _M32
    c ^= b
    c = (c - _rot(b, 16)) & _M32
    a ^= c
    a = (a - _rot(c, 4)) & _M32
    b ^= a
    b = (b - _rot(a, 14)) & _M32
    c ^= b
    c = (c - _rot(b, 24)) & _M32
    return c


def text_hash(data: bytes) -> int:
    """Postgres's ``hashtext`` of ``data`` (lookup3, little-endian words), unsigned."""
    n = len(data)
    a = b = c = (0x9E3779B9 + n + 3923095) & _M32
    pos = 0
    while n - pos >= 12:
        a = (a + int.from_bytes(data[pos : pos + 4], "little")) & _M32
        b = (b + int.from_bytes(data[pos + 4 : pos + 8], "little")) & _M32
        c = (c + int.from_bytes(data[pos + 8 : pos + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        pos += 12
    tail = data[pos:]
    # The last 0..11 bytes: a takes bytes 0-3, b 4-7, c 8-10 shifted up one byte (its
    # lowest byte stands for the length in the algorithm's design).
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & _M32
    return _final(a, b, c)


def _netstring(data: bytes) -> bytes:
    return b"%d:%s" % (len(data), data)


def column_hash(name: str, text: str) -> int:
    """One non-NULL column's contribution."""
    return text_hash(_netstring(name.encode()) + text.encode())


def row_hash(columns: Iterable[tuple[str, str | None]]) -> int:
    """The row hash of ``(column name, text value or None for NULL)`` pairs."""
    return sum(column_hash(n, v) for n, v in columns if v is not None) & _M32


def row_hash_sql(columns: Sequence[str], qualifier: str | None = None) -> sql.Composed:
    """The SQL expression of the row hash over ``columns`` (bigint, never NULL): the same
    number :func:`row_hash` gives for the row's text output. ``qualifier``: a table alias
    to prefix the columns with. Identifiers are quoted; names never become code."""
    pieces: list[sql.Composable] = []
    for name in columns:
        col: sql.Composable = sql.Identifier(qualifier, name) if qualifier else sql.Identifier(name)
        prefix = _netstring(name.encode()).decode()
        # concat() writes a value by its type's output function (the text pgoutput sends;
        # a cast to text would not: bool, inet and char(n) cast differently).
        pieces.append(
            sql.SQL(
                "CASE WHEN {c} IS NULL THEN 0"
                " ELSE pg_catalog.hashtext(pg_catalog.concat({p}, {c}))::bigint END"
            ).format(c=col, p=sql.Literal(prefix))
        )
    body = sql.SQL(" + ").join(pieces) if pieces else sql.SQL("0")
    return sql.SQL("(({}) & 4294967295)").format(body)
