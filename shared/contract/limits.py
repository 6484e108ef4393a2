"""What a consumer accepts from one Kafka record, and the one boundary that turns any
failure to read a record into a reason.

A record is written by whoever may produce to the topic, not necessarily pg2kafka or the
Debezium connector: every size a decoder would otherwise trust (a decimal's scale, a bit
string's length, an array schema's nesting, a JSON value's depth) is checked against the
limits below before any work proportional to it is done. The limits are Postgres' own
where it has one, so no value Postgres can hold is refused:

- :data:`MAX_DECIMAL_SCALE` — a numeric's scale (digits after the point, or zeros before it
  for a negative scale): Postgres' largest display scale, 16383;
- :data:`MAX_DECIMAL_BYTES` — a decimal's unscaled value: the bytes of Postgres' largest
  numeric (131072 digits before the point and 16383 after);
- :data:`MAX_BIT_LENGTH` — a bit string's declared length: Postgres' 83886080 bits;
- :data:`MAX_ARRAY_DIMENSIONS` — arrays nested in arrays: Postgres' 6 dimensions;
- :data:`MAX_JSON_DEPTH` — a JSON value walcast has to encode again (a Debezium record
  translated, a row merged with its unchanged TOAST values): 512 levels; orjson's own
  encoder stops at 255, deeper values up to this limit are written by the standard
  library's encoder (:func:`dumps`);
- :data:`MAX_REASON_CHARS` — a reason's length (dead-letter header, quarantine row, log).

A record that breaks a limit, or that a decoder fails on in a way no rule foresaw, is an
*unreadable record*: :class:`~shared.contract.event.EventDecodeError` with the reason
(:func:`unreadable`), which the sinks dead-letter (kafka2search, kafka2webhook) or
quarantine (kafka2spark) — it never stops a sink.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from shared.contract.event import EventDecodeError
from shared.errors import WalcastError

MAX_DECIMAL_SCALE = 16383
MAX_DECIMAL_BYTES = 61_232  # ceil(log2(10 ** (131072 + 16383)) / 8) + 1 (the sign)
MAX_BIT_LENGTH = 83_886_080
MAX_ARRAY_DIMENSIONS = 6
MAX_JSON_DEPTH = 512
MAX_REASON_CHARS = 1000


def small_int(text: str | int, what: str, limit: int) -> int:
    """An integer given as text (a schema parameter), parsed only when it has at most 12
    digits; a longer one is beyond ``limit`` (every limit here has fewer digits)."""
    if isinstance(text, int):
        return text
    digits = text.strip().lstrip("+-")
    if len(digits) > 12:
        raise EventDecodeError(f"{what} {text[:20]!r}… is beyond {limit} (walcast's limit)")
    return int(text)


def check_scale(scale: int, what: str = "decimal") -> int:
    """``scale`` when within :data:`MAX_DECIMAL_SCALE` either way, else unreadable."""
    if not -MAX_DECIMAL_SCALE <= scale <= MAX_DECIMAL_SCALE:
        raise EventDecodeError(
            f"{what} scale {_short(scale)} is beyond ±{MAX_DECIMAL_SCALE} (Postgres' largest"
            " numeric scale, walcast's limit)"
        )
    return scale


def check_decimal_bytes(size: int, what: str = "decimal") -> None:
    """A decimal's unscaled value of ``size`` bytes: unreadable beyond
    :data:`MAX_DECIMAL_BYTES`."""
    if size > MAX_DECIMAL_BYTES:
        raise EventDecodeError(
            f"{what} value of {size} bytes is larger than Postgres' largest numeric"
            f" ({MAX_DECIMAL_BYTES} bytes, walcast's limit)"
        )


def check_bit_length(length: int) -> int:
    """A bit string's declared length, when from 0 to :data:`MAX_BIT_LENGTH`."""
    if not 0 <= length <= MAX_BIT_LENGTH:
        raise EventDecodeError(
            f"bit string length {_short(length)} is not from 0 to {MAX_BIT_LENGTH} (Postgres'"
            " largest bit string, walcast's limit)"
        )
    return length


def check_dimensions(depth: int) -> None:
    """Arrays nested ``depth`` deep (1: a plain array): unreadable beyond
    :data:`MAX_ARRAY_DIMENSIONS`."""
    if depth > MAX_ARRAY_DIMENSIONS:
        raise EventDecodeError(
            f"arrays nested deeper than {MAX_ARRAY_DIMENSIONS} dimensions (Postgres' limit,"
            " walcast's)"
        )


def depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The nesting depth of a JSON value (a scalar: 0), counted without recursion and
    only up to ``limit`` + 1 (a deeper value is not walked further)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        if level > deepest:
            deepest = level
            if deepest > limit:
                return deepest
        stack.extend((c, level) for c in children)
    return deepest


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON, as orjson writes it; a value nested deeper than
    orjson's encoder goes (255 levels) and no deeper than :data:`MAX_JSON_DEPTH` by the
    standard library's encoder (valid JSON too: ``1e+16`` where orjson writes ``1e16``).
    :class:`EventDecodeError` with the reason for anything else (deeper, an integer
    beyond 64 bits, a string that is no UTF-8)."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:  # orjson.JSONEncodeError
        cause = str(exc)
    if "Recursion limit" not in cause:
        raise EventDecodeError(f"a value cannot be written as JSON: {cause[:200]}") from None
    if depth(value) > MAX_JSON_DEPTH:
        raise EventDecodeError(
            f"a JSON value nested deeper than {MAX_JSON_DEPTH} levels (walcast's limit)"
        )
    try:
        return json.dumps(
            value, ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ).encode()
    except (ValueError, TypeError, RecursionError) as exc:
        raise EventDecodeError(
            f"a value cannot be written as JSON ({type(exc).__name__})"
        ) from None


def unreadable(exc: Exception, what: str = "record") -> EventDecodeError:
    """The unreadable-record error for a failure of a decoder on one record: its own
    reason for :class:`EventDecodeError`, else what failed and how (a failure no rule
    foresaw: a malformed record, or a limit of walcast's). The reason is at most
    :data:`MAX_REASON_CHARS` long. Never called with a :class:`WalcastError` that is not
    about the record (the caller lets those pass: a registry down, a missing setting)."""
    if isinstance(exc, EventDecodeError):
        text = str(exc)
        return exc if len(text) <= MAX_REASON_CHARS else EventDecodeError(_cut(text))
    if isinstance(exc, RecursionError):
        detail = "nested too deeply"
    elif isinstance(exc, MemoryError):
        detail = "too large to decode"
    else:
        detail = f"{type(exc).__name__}: {describe(exc)}"
    return EventDecodeError(_cut(f"unreadable {what} (the decoder failed: {detail})"))


def passes(exc: BaseException) -> bool:
    """Whether a failure while decoding a record is not the record's: walcast's own
    errors other than :class:`EventDecodeError` (the schema registry unreachable, a
    setting missing) stop or retry as everywhere else, and so does anything that is no
    :class:`Exception` (KeyboardInterrupt, SystemExit)."""
    return not isinstance(exc, Exception) or (
        isinstance(exc, WalcastError) and not isinstance(exc, EventDecodeError)
    )


def describe(exc: Exception) -> str:
    """An exception's text, or its arguments' repr when the text is no message (a
    KeyError's is the missing key alone)."""
    if isinstance(exc, LookupError):
        return f"no entry {exc.args[0]!r:.100}" if exc.args else "no entry"
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no detail"


def _short(n: int) -> str:
    return str(n) if -(10**30) < n < 10**30 else ("-" if n < 0 else "") + "10^30 or more"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def zero_width_avro_items(parsed: Any) -> bool:
    """Whether a parsed Avro schema has an array or map whose items may encode in no
    bytes (``null``, an empty record, a zero-size fixed): a record of it may claim 2^63
    items at no cost, so walcast does not read it. Walked without recursion."""
    named: dict[str, Any] = {}
    stack: list[Any] = [parsed]
    seen: set[int] = set()
    while stack:
        s = stack.pop()
        if isinstance(s, list):
            stack.extend(s)
            continue
        if isinstance(s, str) or not isinstance(s, dict) or id(s) in seen:
            continue
        seen.add(id(s))
        kind = s.get("type")
        if kind in ("record", "error", "enum", "fixed") and isinstance(s.get("name"), str):
            named[s["name"]] = s
        if kind in ("array", "map"):
            items = s.get("items" if kind == "array" else "values")
            if _zero_width(items, named):
                return True
            stack.append(items)
        elif kind in ("record", "error"):
            stack.extend(f.get("type") for f in s.get("fields") or () if isinstance(f, dict))
        elif isinstance(kind, (dict, list)):
            stack.append(kind)
    return False


def _zero_width(schema: Any, named: dict[str, Any]) -> bool:
    if isinstance(schema, str):
        schema = named.get(schema, schema)
    if schema == "null" or (isinstance(schema, dict) and schema.get("type") == "null"):
        return True
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "fixed":
            return schema.get("size") == 0
        if kind in ("record", "error"):
            return all(_zero_width(f.get("type"), {}) for f in schema.get("fields") or ())
    return False
