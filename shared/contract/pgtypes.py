"""The one table of Postgres types: from a column's type to the event value, the search
field and the Delta column.

Every service derives what it knows about a type from :data:`TYPES`:

* pg2kafka converts a column's text output with the row's ``convert`` and labels the
  column with ``name`` (arrays: ``"_" + name``, as ``pg_type`` names them);
* kafka2search maps a column to the row's ``search`` field mapping (arrays like their
  elements: the engines index arrays of any field);
* kafka2spark declares a column as the row's ``spark`` type (arrays as arrays of it).

Adding a type is one row here plus its case in the type walk test
(``tests/e2e/test_type_walk.py``); ``tests/integration/pg2kafka/test_type_table.py``
checks every OID, name and array OID against the server's ``pg_type``. A type not in the
table (enums, ranges, extension types, the rarer built-ins) travels as its text output,
named by ``pg_type.typname``, indexed as a keyword and stored as a string: nothing is lost,
nothing guessed.

Values (pgoutput without ``binary`` sends every value as the type's text output; the
replication connection pins ``DateStyle=ISO``, ``TimeZone=UTC``,
``IntervalStyle=iso_8601``, ``extra_float_digits=3``, ``bytea_output=hex``):

* integers → int; ``numeric`` → the exact string; floats → float (``NaN`` and
  ``±Infinity`` stay strings: JSON has no such numbers);
* boolean → bool; json / jsonb → the server's JSON text, embedded unparsed (exact);
* timestamp / timestamptz → ISO-8601 (``T`` separator, ``+hh:mm`` offsets); date →
  ``YYYY-MM-DD``; years before 1 AD or after 9999 in ISO's expanded form with
  astronomical numbering (``0044-03-15 BC`` → ``-0043-03-15``, ``+12345-01-01``);
  ``infinity`` / ``-infinity`` kept as these strings;
* bytea → base64; everything else → the text;
* arrays → JSON arrays (nested, NULL → null) converted element-wise.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

Converter = Callable[[str], Any]


def _bool(v: str) -> bool:
    return v == "t"


def _float(v: str) -> float | str:
    try:
        f = float(v)
    except ValueError:
        return v
    if f != f or f in (float("inf"), float("-inf")):
        return v  # NaN / Infinity: JSON has no such numbers
    return f


def _json(v: str) -> orjson.Fragment:
    """The server's JSON text, embedded in the event as is: parsed, ``12345678901234567.89``
    would become ``1.2345678901234568e16``, big integers floats, and ``1e309`` an error.
    Line breaks (only whitespace between tokens: JSON strings cannot hold them raw)
    become spaces, so an event stays one line."""
    if "\n" in v or "\r" in v:
        v = v.replace("\r", " ").replace("\n", " ")
    return orjson.Fragment(v)


def _bytea(v: str) -> str:
    if v.startswith("\\x"):
        return base64.b64encode(bytes.fromhex(v[2:])).decode("ascii")
    return base64.b64encode(v.encode()).decode("ascii")  # escape format: not expected


def _common_era(v: str) -> bool:
    """A year of four digits, not BC: the text needs no rewriting (the fast path)."""
    return v[4:5] == "-" and v[-1] != "C"


def _expanded_year(v: str) -> str:
    """Postgres writes ``0044-03-15 BC`` and ``12345-01-01``; ISO-8601's expanded form,
    with astronomical years, is ``-0043-03-15`` and ``+12345-01-01`` (what Spark and
    Java's ISO parsers read). ``infinity`` / ``-infinity`` stay as they are."""
    if v in ("infinity", "-infinity"):
        return v
    bc = v.endswith(" BC")
    if bc:
        v = v[:-3]
    dash = v.index("-")
    year = int(v[:dash])
    if bc:
        year = 1 - year
    head = f"{year:04d}" if 0 <= year <= 9999 else f"{year:+05d}"
    return head + v[dash:]


def _date(v: str) -> str:
    return v if _common_era(v) else _expanded_year(v)


def _timestamp(v: str) -> str:
    if not _common_era(v):
        v = _expanded_year(v)
        if v in ("infinity", "-infinity"):
            return v
    return v.replace(" ", "T", 1)


def _timestamptz(v: str) -> str:
    if not _common_era(v):
        v = _expanded_year(v)
        if v in ("infinity", "-infinity"):
            return v
    v = v.replace(" ", "T", 1)
    # "+00" / "-05" / "+05:30": ISO-8601 wants hh:mm.
    sign = max(v.rfind("+"), v.rfind("-"))
    if sign > 10:
        offset = v[sign + 1 :]
        if len(offset) == 2:
            v = v + ":00"
    return v


def text(v: str) -> str:
    """The text output itself. Callers may skip calling it: the text is the value."""
    return v


# Search field mappings (OpenSearch and Elasticsearch share them).
_KEYWORD: Mapping[str, Any] = {"type": "keyword", "ignore_above": 8191}
_TEXT: Mapping[str, Any] = {
    "type": "text",
    "fields": {"keyword": {"type": "keyword", "ignore_above": 256}},
}
# ignore_malformed: Postgres' infinity / -infinity are no dates to an engine; the document
# is indexed with the value kept in _source (and in _ignored), not dead-lettered. Expanded
# years (-0043-03-15, +12345-01-01) parse as dates.
_DATE: Mapping[str, Any] = {
    "type": "date",
    "format": "strict_date_optional_time||epoch_millis",
    "ignore_malformed": True,
}
_OPAQUE_JSON: Mapping[str, Any] = {"type": "object", "enabled": False}
_BOOL: Mapping[str, Any] = {"type": "boolean"}
_BINARY: Mapping[str, Any] = {"type": "binary"}
_SHORT: Mapping[str, Any] = {"type": "short"}
_INTEGER: Mapping[str, Any] = {"type": "integer"}
_LONG: Mapping[str, Any] = {"type": "long"}
# A "NaN" stays in _source, unindexed.
_FLOAT: Mapping[str, Any] = {"type": "float", "ignore_malformed": True}
_DOUBLE: Mapping[str, Any] = {"type": "double", "ignore_malformed": True}


@dataclass(frozen=True, slots=True)
class PgType:
    """One Postgres type and what each service makes of it.

    ``oid`` / ``array_oid`` are ``pg_type.oid`` / ``pg_type.typarray`` (built-in OIDs are
    stable across versions; 0 for an extension type known by name only). ``spark`` is a
    Spark SQL type name (``kafka2spark.schema`` turns it into a ``DataType``).
    """

    oid: int
    name: str
    array_oid: int
    convert: Converter
    search: Mapping[str, Any]
    spark: str

    @property
    def array_name(self) -> str:
        return "_" + self.name


def _t(
    oid: int, name: str, array_oid: int, convert: Converter, search: Mapping[str, Any], spark: str
) -> PgType:
    return PgType(oid, name, array_oid, convert, search, spark)


# fmt: off
TYPES: tuple[PgType, ...] = (
    _t(16,   "bool",        1000, _bool,        _BOOL,        "boolean"),
    _t(17,   "bytea",       1001, _bytea,       _BINARY,      "binary"),
    _t(18,   "char",        1002, text,         _KEYWORD,     "string"),
    _t(19,   "name",        1003, text,         _KEYWORD,     "string"),
    _t(20,   "int8",        1016, int,          _LONG,        "bigint"),
    _t(21,   "int2",        1005, int,          _SHORT,       "smallint"),
    _t(23,   "int4",        1007, int,          _INTEGER,     "int"),
    _t(25,   "text",        1009, text,         _TEXT,        "string"),
    _t(26,   "oid",         1028, int,          _LONG,        "bigint"),
    _t(28,   "xid",         1011, int,          _LONG,        "bigint"),
    _t(114,  "json",        199,  _json,        _OPAQUE_JSON, "string"),
    _t(142,  "xml",         143,  text,         _KEYWORD,     "string"),
    _t(650,  "cidr",        651,  text,         _KEYWORD,     "string"),
    _t(700,  "float4",      1021, _float,       _FLOAT,       "float"),
    _t(701,  "float8",      1022, _float,       _DOUBLE,      "double"),
    _t(774,  "macaddr8",    775,  text,         _KEYWORD,     "string"),
    _t(790,  "money",       791,  text,         _KEYWORD,     "string"),
    _t(829,  "macaddr",     1040, text,         _KEYWORD,     "string"),
    _t(869,  "inet",        1041, text,         _KEYWORD,     "string"),
    _t(1042, "bpchar",      1014, text,         _TEXT,        "string"),
    _t(1043, "varchar",     1015, text,         _TEXT,        "string"),
    _t(1082, "date",        1182, _date,        _DATE,        "date"),
    _t(1083, "time",        1183, text,         _KEYWORD,     "string"),
    _t(1114, "timestamp",   1115, _timestamp,   _DATE,        "timestamp_ntz"),
    _t(1184, "timestamptz", 1185, _timestamptz, _DATE,        "timestamp"),
    _t(1186, "interval",    1187, text,         _KEYWORD,     "string"),
    _t(1266, "timetz",      1270, text,         _KEYWORD,     "string"),
    _t(1560, "bit",         1561, text,         _KEYWORD,     "string"),
    _t(1562, "varbit",      1563, text,         _KEYWORD,     "string"),
    # numeric: the exact string in the event and in _source; indexed as double so ranges
    # and sorting work (a NaN stays in _source only).
    _t(1700, "numeric",     1231, text,         _DOUBLE,      "string"),
    _t(2950, "uuid",        2951, text,         _KEYWORD,     "string"),
    _t(3614, "tsvector",    3643, text,         _KEYWORD,     "string"),
    _t(3802, "jsonb",       3807, _json,        _OPAQUE_JSON, "string"),
    # Extension types, known by name (their OIDs differ per database).
    _t(0,    "citext",      0,    text,         _TEXT,        "string"),
)
# fmt: on

UNKNOWN_SEARCH: Mapping[str, Any] = _KEYWORD
UNKNOWN_SPARK = "string"

BY_OID: dict[int, PgType] = {t.oid: t for t in TYPES if t.oid}
"""Built-in type OID → its row."""
ELEMENT_OF: dict[int, PgType] = {t.array_oid: t for t in TYPES if t.array_oid}
"""Built-in array type OID → its element's row."""
BY_NAME: dict[str, PgType] = {t.name: t for t in TYPES}
"""``pg_type.typname`` → its row (element types only; see :func:`by_name`)."""


def builtin_name(oid: int) -> str | None:
    """The ``pg_type.typname`` of a type in the table or an array of one, else None."""
    row = BY_OID.get(oid)
    if row is not None:
        return row.name
    elem = ELEMENT_OF.get(oid)
    return elem.array_name if elem is not None else None


def by_name(name: str) -> tuple[PgType | None, bool]:
    """The row for a type name as events carry it, and whether it is an array of it.
    ``(None, is_array)`` for a type outside the table."""
    if name.startswith("_"):
        return BY_NAME.get(name[1:]), True
    return BY_NAME.get(name), False


def search_mapping(name: str) -> Mapping[str, Any]:
    """The search field mapping of a column; arrays map like their elements."""
    row, _ = by_name(name)
    return row.search if row is not None else UNKNOWN_SEARCH


def parse_array(literal: str, elem: Converter, delimiter: str = ",") -> list[Any]:
    """Parse a Postgres array literal (``{1,NULL,"a b",{2,3}}``) into nested lists.

    Handles quoting, backslash escapes, NULL and nesting. A leading dimension decoration
    (``[0:2]={...}``) is skipped; the elements keep their order.
    """
    if literal.startswith("["):
        literal = literal[literal.find("=") + 1 :]
    pos = 0
    n = len(literal)

    def parse_level() -> list[Any]:
        nonlocal pos
        if literal[pos] != "{":
            raise ValueError(f"malformed array literal: {literal!r}")
        pos += 1
        out: list[Any] = []
        if pos < n and literal[pos] == "}":
            pos += 1
            return out
        while pos < n:
            ch = literal[pos]
            if ch == "{":
                out.append(parse_level())
            elif ch == '"':
                pos += 1
                buf = []
                while pos < n and literal[pos] != '"':
                    if literal[pos] == "\\":
                        pos += 1
                    buf.append(literal[pos])
                    pos += 1
                pos += 1  # closing quote
                out.append(elem("".join(buf)))
            else:
                start = pos
                while pos < n and literal[pos] not in (delimiter, "}"):
                    pos += 1
                word = literal[start:pos].strip()
                out.append(None if word == "NULL" else elem(word))
            if pos >= n:
                break
            if literal[pos] == delimiter:
                pos += 1
            elif literal[pos] == "}":
                pos += 1
                return out
        raise ValueError(f"unterminated array literal: {literal!r}")

    return parse_level()


def array_of(elem: Converter, delimiter: str = ",") -> Converter:
    """A converter for arrays of ``elem``'s type."""

    def convert(v: str) -> Any:
        return parse_array(v, elem, delimiter)

    return convert
