"""Postgres text output → JSON values, by type.

pgoutput (without the binary option) sends every value as the type's text output. The
replication connection pins the output styles (``DateStyle=ISO``, ``TimeZone=UTC``,
``IntervalStyle=iso_8601``, ``extra_float_digits=3``, ``bytea_output=hex``), so one
parser per type suffices:

* integers → int; ``numeric`` → the exact string; floats → float (``NaN`` and
  ``±Infinity`` stay strings, JSON has no such numbers);
* boolean → bool; json / jsonb → the parsed JSON;
* date / timestamp / timestamptz → ISO-8601 (``T`` separator; ``+00:00`` offsets;
  ``infinity`` kept as is);
* bytea → base64; uuid, enums, text types and anything unknown → the text;
* arrays → JSON arrays (nested, NULL → null) converted element-wise;
* domains → converted as their base type.

Types outside the built-in table are looked up once (``TypeInfo`` via a callback that
queries ``pg_type``) and cached by OID.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
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


def _json(v: str) -> Any:
    return orjson.loads(v)


def _bytea(v: str) -> str:
    if v.startswith("\\x"):
        return base64.b64encode(bytes.fromhex(v[2:])).decode("ascii")
    return base64.b64encode(v.encode()).decode("ascii")  # escape format: not expected


def _timestamp(v: str) -> str:
    if v in ("infinity", "-infinity"):
        return v
    return v.replace(" ", "T", 1)


def _timestamptz(v: str) -> str:
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


def _text(v: str) -> str:
    return v


text_converter: Converter = _text  # callers may skip calling it: the text is the value


# Built-in type OIDs (pg_type.dat); stable across versions.
BUILTIN: dict[int, Converter] = {
    16: _bool,
    20: int,
    21: int,
    23: int,
    26: int,
    28: int,  # xid
    700: _float,
    701: _float,
    1700: _text,  # numeric: exact, as a string
    114: _json,
    3802: _json,
    17: _bytea,
    1082: _text,  # date: already YYYY-MM-DD under DateStyle=ISO
    1114: _timestamp,
    1184: _timestamptz,
    1083: _text,  # time
    1266: _text,  # timetz
    1186: _text,  # interval, iso_8601 style
    2950: _text,  # uuid
    25: _text,
    1043: _text,
    1042: _text,
    19: _text,
    18: _text,
    790: _text,  # money
}

# Array OID → element OID for the built-ins above.
BUILTIN_ARRAYS: dict[int, int] = {
    1000: 16, 1016: 20, 1005: 21, 1007: 23, 1028: 26, 1021: 700, 1022: 701, 1231: 1700,
    199: 114, 3807: 3802, 1001: 17, 1182: 1082, 1115: 1114, 1185: 1184, 1183: 1083,
    1270: 1266, 1187: 1186, 2951: 2950, 1009: 25, 1015: 1043, 1014: 1042, 1003: 19,
    1002: 18,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """What ``pg_type`` says about a type walcast does not know by OID."""

    oid: int
    name: str
    kind: str  # pg_type.typtype: b base, d domain, e enum, c composite, r range, m multirange
    base_oid: int  # for domains (typbasetype), else 0
    element_oid: int  # for arrays (typelem when typcategory = 'A'), else 0
    delimiter: str = ","


TypeLookup = Callable[[int], TypeInfo | None]


class TypeRegistry:
    """Finds the converter for a type OID; unknown OIDs are asked of ``lookup`` once."""

    def __init__(self, lookup: TypeLookup | None = None) -> None:
        self._lookup = lookup
        self._cache: dict[int, Converter] = dict(BUILTIN)
        self._names: dict[int, str] = {}
        for arr, elem in BUILTIN_ARRAYS.items():
            self._cache[arr] = _array_of(BUILTIN[elem])

    def converter(self, oid: int) -> Converter:
        conv = self._cache.get(oid)
        if conv is None:
            conv = self._resolve(oid, depth=0)
            self._cache[oid] = conv
        return conv

    def convert(self, oid: int, value: str) -> Any:
        return self.converter(oid)(value)

    def forget(self, oid: int) -> None:
        """Drop a cached non-builtin type (a Type message announced a change)."""
        if oid not in BUILTIN and oid not in BUILTIN_ARRAYS:
            self._cache.pop(oid, None)

    def _resolve(self, oid: int, depth: int) -> Converter:
        if depth > 8 or self._lookup is None:
            return _text
        if oid in self._cache:
            return self._cache[oid]
        info = self._lookup(oid)
        if info is None:
            return _text
        self._names[oid] = info.name
        if info.element_oid:
            elem = self._resolve(info.element_oid, depth + 1)
            return _array_of(elem, info.delimiter)
        if info.kind == "d" and info.base_oid:
            return self._resolve(info.base_oid, depth + 1)
        return _text  # enums, ranges, composites, extension types: their text output


def _array_of(elem: Converter, delimiter: str = ",") -> Converter:
    def convert(v: str) -> Any:
        return parse_array(v, elem, delimiter)

    return convert


def parse_array(text: str, elem: Converter, delimiter: str = ",") -> list[Any]:
    """Parse a Postgres array literal (``{1,NULL,"a b",{2,3}}``) into nested lists.

    Handles quoting, backslash escapes, NULL and nesting. A leading dimension decoration
    (``[0:2]={...}``) is skipped; the elements keep their order.
    """
    if text.startswith("["):
        eq = text.find("=")
        text = text[eq + 1 :]
    pos = 0
    n = len(text)

    def parse_level() -> list[Any]:
        nonlocal pos
        if text[pos] != "{":
            raise ValueError(f"malformed array literal: {text!r}")
        pos += 1
        out: list[Any] = []
        if pos < n and text[pos] == "}":
            pos += 1
            return out
        while pos < n:
            ch = text[pos]
            if ch == "{":
                out.append(parse_level())
            elif ch == '"':
                pos += 1
                buf = []
                while pos < n and text[pos] != '"':
                    if text[pos] == "\\":
                        pos += 1
                    buf.append(text[pos])
                    pos += 1
                pos += 1  # closing quote
                out.append(elem("".join(buf)))
            else:
                start = pos
                while pos < n and text[pos] not in (delimiter, "}"):
                    pos += 1
                word = text[start:pos].strip()
                out.append(None if word == "NULL" else elem(word))
            if pos >= n:
                break
            if text[pos] == delimiter:
                pos += 1
            elif text[pos] == "}":
                pos += 1
                return out
        raise ValueError(f"unterminated array literal: {text!r}")

    return parse_level()
