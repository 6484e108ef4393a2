"""The one table of Postgres types: from a column's type to the event value, the search
field and the Delta column.

Every service derives what it knows about a type from :data:`TYPES`:

* pg2kafka converts a column's text output by the row's ``kind`` and labels the column
  with ``name`` (arrays: ``"_" + name``, as ``pg_type`` names them). The kinds are
  implemented once, in pg2kafka's compiled per-event path
  (``services/pg2kafka/native/src/conv.rs``; see :data:`KINDS`);
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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

KINDS: Final = {
    "s": "the text itself",
    "i": "integer",
    "f": "double (NaN, ±Infinity stay strings)",
    "b": "boolean",
    "j": "json / jsonb text, embedded",
    "x": "bytea hex → base64",
    "d": "date, ISO-8601 with expanded years",
    "t": "timestamp, ISO-8601",
    "z": "timestamptz, ISO-8601 with ±hh:mm",
}
"""How a type's text output becomes its event value. An array of a type converts
element-wise: its spec is ``"a" + delimiter + element spec`` (``"a,i"``)."""

TEXT_KIND: Final = "s"


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
    kind: str
    search: Mapping[str, Any]
    spark: str

    @property
    def array_name(self) -> str:
        return "_" + self.name


def _t(
    oid: int, name: str, array_oid: int, kind: str, search: Mapping[str, Any], spark: str
) -> PgType:
    return PgType(oid, name, array_oid, kind, search, spark)


# fmt: off
TYPES: tuple[PgType, ...] = (
    _t(16,   "bool",        1000, "b",          _BOOL,        "boolean"),
    _t(17,   "bytea",       1001, "x",          _BINARY,      "binary"),
    _t(18,   "char",        1002, "s",          _KEYWORD,     "string"),
    _t(19,   "name",        1003, "s",          _KEYWORD,     "string"),
    _t(20,   "int8",        1016, "i",          _LONG,        "bigint"),
    _t(21,   "int2",        1005, "i",          _SHORT,       "smallint"),
    _t(23,   "int4",        1007, "i",          _INTEGER,     "int"),
    _t(25,   "text",        1009, "s",          _TEXT,        "string"),
    _t(26,   "oid",         1028, "i",          _LONG,        "bigint"),
    _t(28,   "xid",         1011, "i",          _LONG,        "bigint"),
    _t(114,  "json",        199,  "j",          _OPAQUE_JSON, "string"),
    _t(142,  "xml",         143,  "s",          _KEYWORD,     "string"),
    _t(650,  "cidr",        651,  "s",          _KEYWORD,     "string"),
    _t(700,  "float4",      1021, "f",          _FLOAT,       "float"),
    _t(701,  "float8",      1022, "f",          _DOUBLE,      "double"),
    _t(774,  "macaddr8",    775,  "s",          _KEYWORD,     "string"),
    _t(790,  "money",       791,  "s",          _KEYWORD,     "string"),
    _t(829,  "macaddr",     1040, "s",          _KEYWORD,     "string"),
    _t(869,  "inet",        1041, "s",          _KEYWORD,     "string"),
    _t(1042, "bpchar",      1014, "s",          _TEXT,        "string"),
    _t(1043, "varchar",     1015, "s",          _TEXT,        "string"),
    _t(1082, "date",        1182, "d",          _DATE,        "date"),
    _t(1083, "time",        1183, "s",          _KEYWORD,     "string"),
    _t(1114, "timestamp",   1115, "t",          _DATE,        "timestamp_ntz"),
    _t(1184, "timestamptz", 1185, "z",          _DATE,        "timestamp"),
    _t(1186, "interval",    1187, "s",          _KEYWORD,     "string"),
    _t(1266, "timetz",      1270, "s",          _KEYWORD,     "string"),
    _t(1560, "bit",         1561, "s",          _KEYWORD,     "string"),
    _t(1562, "varbit",      1563, "s",          _KEYWORD,     "string"),
    # numeric: the exact string in the event and in _source; indexed as double so ranges
    # and sorting work (a NaN stays in _source only).
    _t(1700, "numeric",     1231, "s",          _DOUBLE,      "string"),
    _t(2950, "uuid",        2951, "s",          _KEYWORD,     "string"),
    _t(3614, "tsvector",    3643, "s",          _KEYWORD,     "string"),
    _t(3802, "jsonb",       3807, "j",          _OPAQUE_JSON, "string"),
    # Extension types, known by name (their OIDs differ per database).
    _t(0,    "citext",      0,    "s",          _TEXT,        "string"),
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
