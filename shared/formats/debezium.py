"""(Over 600 lines on purpose: only this module knows Debezium's encodings, one
function per type family, so the mapping is read and checked in one place.)

Debezium's PostgreSQL change-event values and their Kafka Connect schemas, from a
column's Postgres text output (as the replication connection writes it: ``DateStyle=ISO``,
``TimeZone=UTC``, ``IntervalStyle=iso_8601``, ``extra_float_digits=3``, ``bytea_output=hex``).

This is the type mapping of the Debezium connector's defaults (``decimal.handling.mode =
precise``, ``time.precision.mode = adaptive``, ``binary.handling.mode = bytes``,
``interval.handling.mode = numeric``, ``money.fraction.digits = 2``), as its JSON
converter writes it. It was written against records of the real connector (Debezium
3.7.0.Final), which the unit tests replay (``tests/unit/data/debezium_3.7.0_types.json``);
``docs/events.md`` lists what differs.

Only this module knows Debezium's encodings: pg2kafka's ``debezium`` output format builds
records with it, and the sinks read Debezium records back with it.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from shared.contract import limits
from shared.contract.event import EventDecodeError

_EPOCH_DATE = date(1970, 1, 1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROS = 1_000_000
# Debezium's numeric interval: a month is 365.25 / 12 days, a year 365.25 days.
_MONTH_US = 2_629_800 * _MICROS
_DAY_US = 86_400 * _MICROS
# What the connector writes for a date of -infinity / infinity (Debezium's own constants).
_DATE_NEG_INFINITY = -2147472691
_DATE_POS_INFINITY = 2147483647

UNAVAILABLE = "__debezium_unavailable_value"
"""What the connector writes for an unchanged TOAST value it did not receive (as text; as
its bytes in a bytea column, and element by element in an array)."""

VARIABLE_DECIMAL_FIELDS = [
    {"type": "int32", "optional": False, "field": "scale"},
    {"type": "bytes", "optional": False, "field": "value"},
]


def _typmod_precision(typmod: int) -> int | None:
    """The fractional-second precision of time / timestamp types (None: not declared)."""
    return typmod if typmod >= 0 else None


def _numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    if typmod < 4:
        return None
    mod = typmod - 4
    return (mod >> 16) & 0xFFFF, mod & 0xFFFF


def field_schema(column: str, pg_type: str, typmod: int, optional: bool = True) -> dict[str, Any]:
    """The Connect schema of one column, as Debezium's JSON converter writes it (without
    ``default``: the connector adds a column's default only when the catalog has one)."""
    return _connect_order({**_schema(pg_type, typmod), "optional": optional, "field": column})


_ORDER = ("type", "items", "fields", "optional", "name", "version", "doc", "parameters",
          "default", "field")  # fmt: skip


def _connect_order(schema: dict[str, Any]) -> dict[str, Any]:
    """The keys in the order Kafka Connect's JSON converter writes them: the key's bytes,
    hence its partition and its identity under compaction, are the connector's."""
    return {k: schema[k] for k in _ORDER if k in schema}


def _named(type_: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"type": type_, "name": name, "version": 1, **extra}


def _schema(pg_type: str, typmod: int) -> dict[str, Any]:
    if pg_type.startswith("_"):
        # An array column's type modifier is its elements' (numeric(12,2)[]).
        items = _connect_order({**_schema(pg_type[1:], typmod), "optional": True})
        return {"type": "array", "items": items}
    simple = _SIMPLE.get(pg_type)
    if simple is not None:
        return {"type": simple}
    if pg_type == "numeric":
        ps = _numeric_precision_scale(typmod)
        if ps is None:
            return {
                "type": "struct",
                "fields": VARIABLE_DECIMAL_FIELDS,
                "name": "io.debezium.data.VariableScaleDecimal",
                "version": 1,
                "doc": "Variable scaled decimal",
            }
        return _named(
            "bytes",
            "org.apache.kafka.connect.data.Decimal",
            parameters={"scale": str(ps[1]), "connect.decimal.precision": str(ps[0])},
        )
    if pg_type == "money":
        return _named("bytes", "org.apache.kafka.connect.data.Decimal", parameters={"scale": "2"})
    if pg_type == "date":
        return _named("int32", "io.debezium.time.Date")
    if pg_type == "time":
        p = _typmod_precision(typmod)
        if p is not None and p <= 3:
            return _named("int32", "io.debezium.time.Time")
        return _named("int64", "io.debezium.time.MicroTime")
    if pg_type == "timestamp":
        p = _typmod_precision(typmod)
        if p is not None and p <= 3:
            return _named("int64", "io.debezium.time.Timestamp")
        return _named("int64", "io.debezium.time.MicroTimestamp")
    named = _NAMED_STRINGS.get(pg_type)
    if named is not None:
        return _named("string", named)
    if pg_type == "interval":
        return _named("int64", "io.debezium.time.MicroDuration")
    if pg_type in ("bit", "varbit"):
        if typmod == 1:  # bit, bit(1), varbit(1): the connector writes a boolean
            return {"type": "boolean"}
        params = {"length": str(typmod)} if typmod > 0 else {}
        return _named(
            "bytes", "io.debezium.data.Bits", **({"parameters": params} if params else {})
        )
    return {"type": "string"}


_SIMPLE = {
    "int2": "int16",
    "int4": "int32",
    "int8": "int64",
    "oid": "int64",
    "float4": "float",
    "float8": "double",
    "bool": "boolean",
    "bytea": "bytes",
    "text": "string",
    "varchar": "string",
    "bpchar": "string",
    "char": "string",
    "name": "string",
    "citext": "string",
    "inet": "string",
    "cidr": "string",
    "macaddr": "string",
    "macaddr8": "string",
}
_NAMED_STRINGS = {
    "timestamptz": "io.debezium.time.ZonedTimestamp",
    "timetz": "io.debezium.time.ZonedTime",
    "uuid": "io.debezium.data.Uuid",
    "json": "io.debezium.data.Json",
    "jsonb": "io.debezium.data.Json",
    "xml": "io.debezium.data.Xml",
}


# -- values ---------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def twos_complement(n: int) -> bytes:
    """Java's ``BigInteger.toByteArray``: big-endian two's complement, shortest form."""
    length = (n + (n < 0)).bit_length() // 8 + 1
    return n.to_bytes(length, "big", signed=True)


def _decimal_parts(text: str) -> tuple[int, int] | None:
    """(unscaled, scale) of a numeric's text (scale: its digits after the point)."""
    try:
        d = Decimal(text)
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    unscaled = int("".join(map(str, digits)) or "0")
    if sign:
        unscaled = -unscaled
    if exponent > 0:
        return unscaled * 10**exponent, 0
    return unscaled, -exponent


def _numeric(text: str, typmod: int) -> Any:
    ps = _numeric_precision_scale(typmod)
    parts = _decimal_parts(text)
    if parts is None:
        return None  # NaN / ±Infinity: Debezium writes null in precise mode
    unscaled, scale = parts
    if ps is None:
        return {"scale": scale, "value": _b64(twos_complement(unscaled))}
    target = ps[1]
    unscaled = (
        unscaled * 10 ** (target - scale) if target >= scale else unscaled // 10 ** (scale - target)
    )
    return _b64(twos_complement(unscaled))


def _money(text: str, typmod: int) -> Any:
    cleaned = re.sub(r"[^0-9.\-]", "", text.replace("(", "-"))
    return _numeric(cleaned, (((18 << 16) | 2) + 4))


def _bc_year(text: str) -> tuple[str, bool]:
    if text.endswith(" BC"):
        return text[:-3], True
    return text, False


def _date_days(text: str) -> int:
    if text == "infinity":
        return _DATE_POS_INFINITY
    if text == "-infinity":
        return _DATE_NEG_INFINITY
    body, bc = _bc_year(text)
    y, m, d = (int(x) for x in body.split("-"))
    if bc:
        y = 1 - y  # astronomical numbering: 1 BC is year 0
    return _days_from_civil(y, m, d)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar, any year."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _time_us(text: str) -> int:
    hh, mm, rest = text.split(":")
    sec, _, frac = rest.partition(".")
    return ((int(hh) * 60 + int(mm)) * 60 + int(sec)) * _MICROS + int((frac + "000000")[:6])


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# The connector's timestamp ±infinity (its LocalDateTime stand-ins), in microseconds.
_TIMESTAMP_POS_INFINITY_US = 9223372036825200000
_TIMESTAMP_NEG_INFINITY_US = -9223372036832400000


def _int64(n: int) -> int:
    """Saturated to a Java long, as the connector's double arithmetic does: a value out
    of range must not stop the stream (orjson refuses integers beyond 64 bits)."""
    return _INT64_MAX if n > _INT64_MAX else _INT64_MIN if n < _INT64_MIN else n


def _timestamp_us(text: str) -> int:
    if text == "infinity":
        return _TIMESTAMP_POS_INFINITY_US
    if text == "-infinity":
        return _TIMESTAMP_NEG_INFINITY_US
    body, bc = _bc_year(text)
    day, _, clock = body.partition(" ")
    y, m, d = (int(x) for x in day.split("-"))
    if bc:
        y = 1 - y
    return _int64(_days_from_civil(y, m, d) * _DAY_US + _time_us(clock))


def _zoned_timestamp(text: str, typmod: int) -> str:
    """UTC, ``Z``, the column's fractional digits (6 when undeclared), as Debezium writes
    a timestamptz; ``infinity`` / ``-infinity`` stay as they are."""
    if text in ("infinity", "-infinity"):
        return text
    body, bc = _bc_year(text)
    m = re.fullmatch(
        r"(\d+)-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?([+-]\d\d(?::?\d\d){0,2})", body
    )
    if m is None:
        return text
    y = int(m.group(1))
    if bc:
        y = 1 - y
    offset = _offset_seconds(m.group(8))
    micros = int(((m.group(7) or "") + "000000")[:6])
    rest = f"-{m.group(2)}-{m.group(3)}T{m.group(4)}:{m.group(5)}:{m.group(6)}"
    if offset and 1 <= y <= 9999:  # the stream's TimeZone=UTC writes +00: no arithmetic
        local = datetime(y, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                         int(m.group(6)), micros)  # fmt: skip
        try:
            utc = local - timedelta(seconds=offset)
        except OverflowError:
            return text
        y, rest = utc.year, utc.strftime("-%m-%dT%H:%M:%S")
        micros = utc.microsecond
    digits = _typmod_precision(typmod)
    digits = 6 if digits is None else digits
    frac = f".{micros:06d}"[: digits + 1] if digits else ""
    return f"{_iso_year(y)}{rest}{frac}Z"


def _offset_seconds(offset: str) -> int:
    sign = -1 if offset[0] == "-" else 1
    parts = offset[1:].split(":") if ":" in offset else [offset[1:3], offset[3:5] or "0"]
    h = int(parts[0])
    mnt = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    s = int(parts[2]) if len(parts) > 2 else 0
    return sign * (h * 3600 + mnt * 60 + s)


def _zoned_time(text: str) -> str:
    """A timetz in UTC with ``Z`` (ISO offset time: no fraction when it is zero)."""
    m = re.fullmatch(r"(\d\d):(\d\d):(\d\d)(?:\.(\d+))?([+-]\d\d(?::?\d\d){0,2})", text)
    if m is None:
        return text
    us = _time_us(f"{m.group(1)}:{m.group(2)}:{m.group(3)}.{m.group(4) or '0'}")
    us = (us - _offset_seconds(m.group(5)) * _MICROS) % _DAY_US
    t = (datetime.min + timedelta(microseconds=us)).time()
    return _iso_time(t) + "Z"


def _iso_time(t: time) -> str:
    """ISO_OFFSET_TIME's clock: only the fraction digits needed."""
    return f"{t.hour:02d}:{t.minute:02d}:{t.second:02d}" + _trim_fraction(t.microsecond)


_ISO_INTERVAL = re.compile(
    r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?"
)


def _interval_us(text: str) -> int | None:
    m = _ISO_INTERVAL.fullmatch(text)
    if m is None:
        return None
    y, mo, w, d, h, mi = (int(g) if g else 0 for g in m.groups()[:6])
    s = Decimal(m.group(7)) if m.group(7) else Decimal(0)
    months = y * 12 + mo
    days = w * 7 + d
    micros = int((h * 3600 + mi * 60) * _MICROS + s * _MICROS)
    return _int64(months * _MONTH_US + days * _DAY_US + micros)


def _bits(text: str) -> str:
    """bit(n) / varbit: the bits as an integer in little-endian bytes, no trailing zero
    bytes (Java's ``BitSet.toByteArray``: all bits clear is empty)."""
    n = int(text, 2) if text else 0
    return _b64(n.to_bytes((n.bit_length() + 7) // 8, "little"))


def _bytea(text: str) -> str:
    return _b64(bytes.fromhex(text[2:] if text.startswith("\\x") else text))


def _float(text: str) -> Any:
    f = float(text)
    if f != f or f in (float("inf"), float("-inf")):
        return text  # Debezium's JSON converter writes "NaN" / "Infinity" as strings
    return f


_CONVERT: dict[str, Callable[[str, int], Any]] = {
    "int2": lambda t, _: int(t),
    "int4": lambda t, _: int(t),
    "int8": lambda t, _: int(t),
    "oid": lambda t, _: int(t),
    "float4": lambda t, _: _float(t),
    "float8": lambda t, _: _float(t),
    "bool": lambda t, _: t == "t",
    "bytea": lambda t, _: _bytea(t),
    "numeric": _numeric,
    "money": _money,
    "date": lambda t, _: _date_days(t),
    "time": lambda t, m: _time_us(t) // (1000 if 0 <= m <= 3 else 1),
    "timestamp": lambda t, m: _timestamp_us(t) // (1000 if 0 <= m <= 3 else 1),
    "timestamptz": _zoned_timestamp,
    "timetz": lambda t, _: _zoned_time(t),
    "interval": lambda t, _: _interval_us(t),
    "bit": lambda t, m: t == "1" if m == 1 else _bits(t),
    "varbit": lambda t, m: t == "1" if m == 1 else _bits(t),
}


def value(pg_type: str, typmod: int, text: str | None, array: Any = None) -> Any:
    """A column's Debezium value from its text output. Arrays come already split into
    their elements' text (``array``: nested lists of ``str | None``), as the caller's
    array parser left them."""
    if text is None and array is None:
        return None
    if pg_type.startswith("_"):
        return _array(pg_type[1:], typmod, array)
    convert = _CONVERT.get(pg_type)
    assert text is not None
    return convert(text, typmod) if convert is not None else text


def _array(elem: str, typmod: int, items: Any) -> Any:
    if items is None:
        return None
    if isinstance(items, list):
        return [_array(elem, typmod, x) for x in items]
    return value(elem, typmod, items)


def epoch_ms(iso: str) -> int:
    """Milliseconds since the epoch of an ISO-8601 instant (a commit timestamp)."""
    return int((datetime.fromisoformat(iso) - _EPOCH) / timedelta(milliseconds=1))


def absent(field: dict[str, Any]) -> Any:
    """What the connector writes for a required (NOT NULL) column a key-only image does
    not carry: its type's zero, in the column's own encoding."""
    name = field.get("name")
    if name == "org.apache.kafka.connect.data.Decimal":
        return "AA=="
    if name == "io.debezium.data.VariableScaleDecimal":
        return {"scale": 0, "value": "AA=="}
    if name == "io.debezium.time.ZonedTimestamp":
        return "1970-01-01T00:00:00Z"
    if name == "io.debezium.time.ZonedTime":
        return "00:00:00Z"
    return _ZERO.get(str(field.get("type")))


_ZERO: dict[str, Any] = {
    "string": "",
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "float": 0.0,
    "double": 0.0,
    "boolean": False,
    "bytes": "",
    "array": [],
}


SESSION_OPTIONS = "-c lc_monetary=C"
"""The Debezium format reads money as an amount: its text must not depend on the server's
lc_monetary (walcast's event keeps money's text as the server writes it). pg2kafka's
sessions in this format use it, and so does ``verify`` of a sink reading it, whose row
hashes are of that text."""


# -- envelopes ------------------------------------------------------------------------------

SNAPSHOT_VALUES = (
    "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
)

WALCAST_HASH = "walcast_hash"
"""``source.walcast_hash``: the row hash of ``after`` (shared/contract/rowhash.py), which
``verify`` compares; absent where pg2kafka does not hold the whole row (an unchanged
TOAST value) and on the real connector's records."""
WALCAST_MARK = "walcast_mark"
"""``source.walcast_mark``: on a marker record (``op: m``, no before, no after), the id of
the verification whose point of the stream it is (docs/design.md#verification)."""
WALCAST_SNAPSHOT = "walcast_snapshot"
"""``source.walcast_snapshot``: on a marker record (``op: m``, no before, no after), the end
of a table's incremental snapshot — walcast's ``snapshot`` block as JSON text (``phase``
``end`` or ``range_end``, its ``id``, ``rows``, a range end's ``key_ranges``:
docs/events.md): a sink removes the rows it holds (in those ranges) older than the
record's ``source.lsn``, as it does for walcast's own end marker."""
MARK_OP = "m"

SOURCE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "version"},
        {"type": "string", "optional": False, "field": "connector"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": SNAPSHOT_VALUES},
            "default": "false",
            "field": "snapshot",
        },
        {"type": "string", "optional": False, "field": "db"},
        {"type": "string", "optional": True, "field": "sequence"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
        {"type": "int64", "optional": True, "field": "txId"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "int64", "optional": True, "field": "xmin"},
        {"type": "string", "optional": True, "field": "origin"},
        {"type": "int64", "optional": True, "field": "origin_lsn"},
        # walcast's own, optional (a Connect consumer ignores them): the row hash
        # (shared/contract/rowhash.py) and, on a marker record, the verification's id
        {"type": "int64", "optional": True, "field": WALCAST_HASH},
        {"type": "string", "optional": True, "field": WALCAST_MARK},
        {"type": "string", "optional": True, "field": WALCAST_SNAPSHOT},
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "version": 1,
    "field": "source",
}
"""The connector's ``source`` block schema (io.debezium.connector.postgresql.Source), and
walcast's optional fields (:data:`WALCAST_HASH`, :data:`WALCAST_MARK`,
:data:`WALCAST_SNAPSHOT`)."""

TRANSACTION_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}

OPS = {"insert": "c", "update": "u", "delete": "d", "read": "r", "truncate": "t"}
"""walcast's operations as Debezium's ``op`` letters."""


def record_name(prefix: str, schema: str, table: str) -> str:
    """The topic, and the base of the schema names: ``<prefix>.<schema>.<table>``, each
    character Kafka refuses in a topic replaced by ``_`` (as the connector's topic naming
    does)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{prefix}.{schema}.{table}")


def key_schema(name: str, key_fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "struct", "fields": key_fields, "optional": False, "name": f"{name}.Key"}


def _envelope_schema(name: str, images: list[dict[str, Any]]) -> dict[str, Any]:
    # Copies of the shared blocks: a caller that edits the schema it got (a test once
    # dropped walcast's source fields in place) must not change every later record's.
    return {
        "type": "struct",
        "fields": [
            *images,
            copy.deepcopy(SOURCE_SCHEMA),
            *([copy.deepcopy(TRANSACTION_SCHEMA)] if images else []),
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "int64", "optional": True, "field": "ts_us"},
            {"type": "int64", "optional": True, "field": "ts_ns"},
        ],
        "optional": False,
        "name": f"{name}.Envelope",
        "version": 2,
    }


def value_schema(name: str, fields: list[dict[str, Any]]) -> dict[str, Any]:
    row = {"type": "struct", "fields": fields, "optional": True, "name": f"{name}.Value"}
    return _envelope_schema(name, [{**row, "field": "before"}, {**row, "field": "after"}])


def mark_schema(name: str) -> dict[str, Any]:
    """The schema of a marker record: the table's envelope (same name, so that it shares
    the table's subject in a registry) without the row images and the transaction block,
    which a marker has none of — compatible with the full envelope both ways."""
    return _envelope_schema(name, [])


def source(
    *,
    version: str,
    prefix: str,
    db: str,
    schema: str,
    table: str,
    commit_us: int,
    snapshot: str,
    txid: int | None,
    lsn: int | None,
    last_commit_lsn: int | None,
    row_hash: int | None = None,
    mark: str | None = None,
    snapshot_end: str | None = None,
) -> dict[str, Any]:
    """The ``source`` block: where and when the change was made (``commit_us``: the
    transaction's commit time in microseconds since the epoch); ``row_hash`` and ``mark``
    as :data:`WALCAST_HASH` and :data:`WALCAST_MARK` say, ``snapshot_end`` as
    :data:`WALCAST_SNAPSHOT` does."""
    sequence = (
        f'["{last_commit_lsn}","{lsn}"]' if last_commit_lsn is not None else f'[null,"{lsn}"]'
    )
    return {
        "version": version,
        "connector": "postgresql",
        "name": prefix,
        "ts_ms": commit_us // 1000,
        "snapshot": snapshot,
        "db": db,
        "sequence": sequence,
        "ts_us": commit_us,
        "ts_ns": commit_us * 1000,
        "schema": schema,
        "table": table,
        "txId": txid,
        "lsn": lsn,
        "xmin": None,
        "origin": None,
        "origin_lsn": None,
        WALCAST_HASH: row_hash,
        WALCAST_MARK: mark,
        WALCAST_SNAPSHOT: snapshot_end,
    }


def envelope(
    op: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    source_block: dict[str, Any],
    now_us: int,
) -> dict[str, Any]:
    """The value's payload; ``now_us``: when the record was made (the envelope's
    ``ts_*``, processing time in Debezium)."""
    return {
        "before": before,
        "after": after,
        "source": source_block,
        "transaction": None,
        "op": op,
        "ts_ms": now_us // 1000,
        "ts_us": now_us,
        "ts_ns": now_us * 1000,
    }


def with_schema(payload: Any, schema: dict[str, Any] | None) -> dict[str, Any] | Any:
    """As Kafka Connect's JSON converter writes it: ``{"schema", "payload"}`` when schemas
    are enabled, the bare payload otherwise."""
    return payload if schema is None else {"schema": schema, "payload": payload}


# -- reading Debezium records (the sinks' input) ---------------------------------------------

_PG_TYPE_OF_NAME = {
    "org.apache.kafka.connect.data.Decimal": "numeric",
    "io.debezium.data.VariableScaleDecimal": "numeric",
    "io.debezium.time.Date": "date",
    "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.Time": "time",
    "io.debezium.time.MicroTime": "time",
    "io.debezium.time.NanoTime": "time",
    "org.apache.kafka.connect.data.Time": "time",
    "io.debezium.time.Timestamp": "timestamp",
    "io.debezium.time.MicroTimestamp": "timestamp",
    "io.debezium.time.NanoTimestamp": "timestamp",
    "org.apache.kafka.connect.data.Timestamp": "timestamp",
    "io.debezium.time.ZonedTimestamp": "timestamptz",
    "io.debezium.time.ZonedTime": "timetz",
    "io.debezium.time.MicroDuration": "interval",
    "io.debezium.time.Interval": "interval",
    "io.debezium.data.Uuid": "uuid",
    "io.debezium.data.Json": "jsonb",
    "io.debezium.data.Xml": "xml",
    "io.debezium.data.Bits": "varbit",
    "io.debezium.data.Enum": "text",
}
_PG_TYPE_OF_TYPE = {
    "int8": "int2",
    "int16": "int2",
    "int32": "int4",
    "int64": "int8",
    "float": "float4",
    "float32": "float4",
    "double": "float8",
    "float64": "float8",
    "boolean": "bool",
    "string": "text",
    "bytes": "bytea",
}

# Units of the time encodings, per schema name: microseconds in one unit.
_TIME_UNIT_US = {
    "io.debezium.time.Time": 1000,
    "org.apache.kafka.connect.data.Time": 1000,
    "io.debezium.time.MicroTime": 1,
    "io.debezium.time.Timestamp": 1000,
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1,
}


def pg_type(field: dict[str, Any]) -> str:
    """The Postgres type (as walcast's events name it) a Connect field schema stands for;
    ``text`` for what it does not know."""
    if field.get("type") == "array":
        items = field.get("items") or {}
        if isinstance(items, dict) and items.get("type") == "array":
            # Postgres names an array of arrays as the array (``_int4``: any dimensions);
            # how deep the values go is checked with them.
            return pg_type(_innermost(items))
        return "_" + pg_type(items if isinstance(items, dict) else {})
    if field.get("type") == "map":
        return "jsonb"  # hstore in the connector's ``map`` mode: a JSON object
    name = field.get("name")
    if name in _PG_TYPE_OF_NAME:
        return _PG_TYPE_OF_NAME[name]
    return _PG_TYPE_OF_TYPE.get(str(field.get("type")), "text")


def _innermost(field: dict[str, Any]) -> dict[str, Any]:
    """An array schema with its arrays of arrays reduced to one (bounded: no recursion
    over a schema nested by a hostile record)."""
    for _ in range(limits.MAX_ARRAY_DIMENSIONS + 1):
        items = field.get("items")
        if not isinstance(items, dict) or items.get("type") != "array":
            return field
        field = items
    raise EventDecodeError(
        f"array schema nested deeper than {limits.MAX_ARRAY_DIMENSIONS} dimensions"
        " (Postgres' limit, walcast's)"
    )


def _trim_fraction(micros: int) -> str:
    """Postgres' text output of a fraction of a second: no trailing zeros, none at all
    for a whole second."""
    return ("." + f"{micros:06d}".rstrip("0")) if micros else ""


def _iso_date(days: int) -> str:
    if days == _DATE_POS_INFINITY:
        return "infinity"
    if days == _DATE_NEG_INFINITY:
        return "-infinity"
    y, m, d = _civil_from_days(days)
    return _iso_year(y) + f"-{m:02d}-{d:02d}"


def _iso_year(y: int) -> str:
    """ISO-8601's expanded years, as walcast's events write them (astronomical
    numbering: 1 BC is 0000, 2 BC is -0001)."""
    if 0 <= y <= 9999:
        return f"{y:04d}"
    return f"-{-y:04d}" if y < 0 else f"+{y}"


def _civil_from_days(z: int) -> tuple[int, int, int]:
    """The inverse of :func:`_days_from_civil`."""
    z += 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return y + (m <= 2), m, d


def _clock(us: int) -> str:
    s, micros = divmod(us, _MICROS)
    h, rest = divmod(s, 3600)
    return f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}" + _trim_fraction(micros)


def _decimal_text(unscaled: int, scale: int) -> str:
    """The exact decimal text of ``unscaled`` * 10^-``scale``, with ``scale`` digits
    after the point (as Postgres writes a numeric of that scale)."""
    sign = "-" if unscaled < 0 else ""
    magnitude = abs(unscaled)
    # Beyond ~4300 digits Python refuses str(int) (quadratic); Decimal's is not.
    digits = str(magnitude) if magnitude.bit_length() < 14_000 else str(Decimal(magnitude))
    if scale <= 0:
        return sign + digits + "0" * -scale
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def _unscaled(b64: Any) -> int:
    """A Connect decimal's unscaled value (base64 of big-endian two's complement), its
    size checked before it is decoded (:data:`~shared.contract.limits.MAX_DECIMAL_BYTES`)."""
    if not isinstance(b64, str):
        raise TypeError("a decimal's value is not base64 text")
    limits.check_decimal_bytes(len(b64) * 3 // 4)
    return int.from_bytes(base64.b64decode(b64), "big", signed=True)


def _scale(text: Any) -> int:
    """A decimal's scale (an integer, or its text in a schema's parameters), within
    :data:`~shared.contract.limits.MAX_DECIMAL_SCALE`."""
    if type(text) is not int and not isinstance(text, str):
        raise TypeError("a decimal's scale is not an integer")
    return limits.check_scale(limits.small_int(text, "decimal scale", limits.MAX_DECIMAL_SCALE))


def to_walcast(field: dict[str, Any], value: Any, dimensions: int = 0) -> Any:
    """A Debezium value as walcast's change event carries the same column
    (shared/contract/pgtypes.py: numerics as exact text, dates and timestamps ISO-8601,
    bytea base64, json embedded, a map — hstore in ``map`` mode — as a JSON object).
    Lossy where Debezium's encoding is: an interval comes back as seconds (Debezium counts
    a month as 30.4375 days), a timetz in UTC, a numeric NaN as null.

    Sizes are checked before work proportional to them (:mod:`shared.contract.limits`):
    :class:`~shared.contract.event.EventDecodeError` for a value beyond a limit;
    ``ValueError`` / ``TypeError`` / ``KeyError`` for one that does not fit its schema."""
    if value is None:
        return None
    kind = field.get("type")
    name = field.get("name")
    if kind == "array":
        limits.check_dimensions(dimensions + 1)
        items = field.get("items") or {}
        if not isinstance(value, list):
            raise TypeError("an array column's value is not an array")
        return [to_walcast(items, v, dimensions + 1) for v in value]
    if kind == "map":
        if not isinstance(value, dict):
            raise TypeError("a map column's value is not an object")
        values = field.get("values") or {}
        if not isinstance(values, dict):
            raise TypeError("a map schema's values schema is not an object")
        limits.check_dimensions(dimensions + 1)
        return {str(k): to_walcast(values, v, dimensions + 1) for k, v in value.items()}
    if name == "org.apache.kafka.connect.data.Decimal":
        scale = _scale((field.get("parameters") or {}).get("scale", "0"))
        return _decimal_text(_unscaled(value), scale)
    if name == "io.debezium.data.VariableScaleDecimal":
        if not isinstance(value, dict):
            raise TypeError("a VariableScaleDecimal is not a struct of scale and value")
        return _decimal_text(_unscaled(value["value"]), _scale(value["scale"]))
    if name in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
        return _iso_date(int(value))
    if pg_type(field) == "time":
        unit = _TIME_UNIT_US.get(str(name))
        return _clock(int(value) * unit if unit else int(value) // 1000)
    if pg_type(field) == "timestamp":
        unit = _TIME_UNIT_US.get(str(name))
        us = int(value) * unit if unit else int(value) // 1000
        days, clock = divmod(us, _DAY_US)
        return _iso_date(days) + "T" + _clock(clock)
    if name == "io.debezium.time.ZonedTimestamp":
        return _zoned_to_walcast(str(value))
    if name == "io.debezium.time.ZonedTime":
        return str(value).removesuffix("Z") + "+00" if str(value).endswith("Z") else value
    if name == "io.debezium.time.MicroDuration":
        secs, micros = divmod(abs(int(value)), _MICROS)
        sign = "-" if int(value) < 0 else ""
        return f"PT{sign}{secs}{_trim_fraction(micros)}S"
    if name == "io.debezium.data.Json":
        return _json_value(str(value))
    if name == "io.debezium.data.Bits":
        text = (field.get("parameters") or {}).get("length", "0")
        length = limits.check_bit_length(
            limits.small_int(text, "bit string length", limits.MAX_BIT_LENGTH)
        )
        n = int.from_bytes(base64.b64decode(value), "little")
        return format(n, "b").rjust(length, "0") if length else format(n, "b")
    return value


def _zoned_to_walcast(text: str) -> str:
    if text in ("infinity", "-infinity") or not text.endswith("Z"):
        return text
    body = text[:-1]
    head, _, frac = body.partition(".")
    frac = frac.rstrip("0")
    return head + ("." + frac if frac else "") + "+00:00"


def _json_value(text: str) -> Any:
    return orjson.loads(text)
