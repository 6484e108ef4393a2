"""Debezium records in Avro: Kafka Connect schemas and values as Avro, and back.

This is what Confluent's ``AvroConverter`` does with a Debezium record (its ``AvroData``
rules, as documented): a Connect ``struct`` becomes a record named after the Connect name
(``<prefix>.<schema>.<table>.Value`` → namespace ``<prefix>.<schema>.<table>``, name
``Value``; a name met again is a reference); ``int8`` / ``int16`` are Avro ``int`` with
``connect.type``; ``int32`` / ``int64`` / ``float`` / ``double`` / ``boolean`` / ``string``
/ ``bytes`` their Avro namesakes; a Connect ``Decimal`` is ``bytes`` with the ``decimal``
logical type (precision from ``connect.decimal.precision``, else 64); every other named
type keeps its base type with ``connect.name`` / ``connect.version`` /
``connect.parameters`` / ``connect.doc`` attributes; an optional field is a union with
``null`` (``null`` first and a ``null`` default; a field with another default has it
first). Values: bytes as bytes (base64 in the JSON converter), decimals as
``decimal.Decimal``; a Connect ``map`` (string keys: hstore in the connector's ``map``
mode) an Avro ``map``.

:func:`connect_schema` and :func:`from_datum` read the attributes back, so a Debezium
record written in Avro is the same record once read — which is how the sinks read
Debezium's Avro: back to the JSON converter's shape, then
:mod:`shared.formats.debezium_input` as for JSON (checked on the real connector's
records: ``tests/unit/test_debezium_avro.py``). pg2kafka writes with it under
``format: debezium`` + ``encoding: avro`` (:class:`shared.avro.ConnectRegistryEncoder`).
"""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

from shared.contract import limits
from shared.contract.event import EventDecodeError
from shared.formats.debezium import twos_complement

_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_MAX_UNSCALED_DIGITS = 131072 + 16383  # Postgres' largest numeric
_PRIMITIVE = {"int32": "int", "int64": "long", "float": "float", "double": "double",
              "boolean": "boolean", "string": "string", "bytes": "bytes"}  # fmt: skip
_CONNECT_OF_AVRO = {"int": "int32", "long": "int64", "float": "float", "double": "double",
                    "boolean": "boolean", "string": "string", "bytes": "bytes"}  # fmt: skip
_ATTRIBUTES = (("name", "connect.name"), ("version", "connect.version"),
               ("parameters", "connect.parameters"), ("doc", "connect.doc"))  # fmt: skip


def avro_schema(connect: dict[str, Any]) -> Any:
    """The Avro schema of a Connect schema (the JSON converter's ``schema`` part)."""
    return _avro(connect, set())


def _avro(c: dict[str, Any], defined: set[str]) -> Any:
    kind = c["type"]
    name = c.get("name")
    if kind == "struct":
        full = name or "io.confluent.connect.avro.ConnectDefault"
        if full in defined:
            return full  # a name met again: a reference
        defined.add(full)
        ns, _, simple = full.rpartition(".")
        out: dict[str, Any] = {"type": "record", "name": simple, "fields": []}
        if ns:
            out["namespace"] = ns
        for f in c.get("fields", ()):
            field: dict[str, Any] = {"name": f["field"]}
            t = _avro(f, defined)
            if f.get("optional"):
                if f.get("default") is not None:
                    field["type"] = [t, "null"]
                    field["default"] = f["default"]
                else:
                    field["type"] = ["null", t]
                    field["default"] = None
            else:
                field["type"] = t
            out["fields"].append(field)
        _attributes(c, out)
        return out
    if kind == "array":
        items = _avro(c["items"], defined)
        return {"type": "array", "items": ["null", items] if c["items"].get("optional") else items}
    if kind == "map":  # string keys (hstore in the connector's map mode): an Avro map
        values = _avro(c["values"], defined)
        optional = c["values"].get("optional")
        return {"type": "map", "values": ["null", values] if optional else values}
    if kind in ("int8", "int16"):
        out = {"type": "int", "connect.type": kind}
    elif kind in _PRIMITIVE:
        out = {"type": _PRIMITIVE[kind]}
    else:
        raise ValueError(f"Connect type {kind!r} has no Avro form here")
    if name == _DECIMAL:
        params = c.get("parameters") or {}
        out["logicalType"] = "decimal"
        out["scale"] = int(params.get("scale", "0"))
        out["precision"] = int(params.get("connect.decimal.precision", "64"))
    _attributes(c, out)
    return out if len(out) > 1 else out["type"]


def _attributes(c: dict[str, Any], out: dict[str, Any]) -> None:
    for key, attribute in _ATTRIBUTES:
        if c.get(key) is not None:
            out[attribute] = c[key]


def to_datum(connect: dict[str, Any], value: Any) -> Any:
    """A Connect JSON value (the ``payload`` part) as the datum of :func:`avro_schema`."""
    if value is None:
        return None
    kind = connect["type"]
    if kind == "struct":
        return {f["field"]: to_datum(f, value.get(f["field"])) for f in connect["fields"]}
    if kind == "array":
        return [to_datum(connect["items"], v) for v in value]
    if kind == "map":
        return {k: to_datum(connect["values"], v) for k, v in value.items()}
    if kind == "bytes":
        raw = base64.b64decode(value)
        if connect.get("name") == _DECIMAL:
            scale = int((connect.get("parameters") or {}).get("scale", "0"))
            return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)
        return raw
    return value


def connect_schema(avro: Any, named: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Connect schema an Avro schema of :func:`avro_schema` stands for (without the
    ``optional`` flag of the outermost schema, which the caller knows)."""
    named = {} if named is None else named
    if isinstance(avro, str):
        if avro in named:
            return dict(named[avro])
        if avro not in _CONNECT_OF_AVRO:
            raise EventDecodeError(
                f"Avro type {avro[:100]!r} has no Kafka Connect form walcast reads"
            )
        return {"type": _CONNECT_OF_AVRO[avro], "optional": False}
    kind = avro["type"]
    if kind == "record":
        ns = avro.get("namespace")
        full = f"{ns}.{avro['name']}" if ns else avro["name"]
        fields = []
        for f in avro["fields"]:
            t = f["type"]
            optional = isinstance(t, list)
            inner = next(x for x in t if x != "null") if optional else t
            field = {**connect_schema(inner, named), "optional": optional, "field": f["name"]}
            if optional and f.get("default") is not None:
                field["default"] = f["default"]
            fields.append(field)
        out: dict[str, Any] = {"type": "struct", "fields": fields, "optional": False}
        _connect_attributes(avro, out)
        named[full] = out
        return out
    if kind in ("array", "map"):
        part = "items" if kind == "array" else "values"
        items = avro[part]
        optional = isinstance(items, list)
        inner = next(x for x in items if x != "null") if optional else items
        out = {"type": kind, part: {**connect_schema(inner, named), "optional": optional},
               "optional": False}  # fmt: skip
        if kind == "map":  # Avro's map keys are strings
            out = {"type": "map", "keys": {"type": "string", "optional": False},
                   "values": out["values"], "optional": False}  # fmt: skip
        return out
    if kind not in _CONNECT_OF_AVRO and "connect.type" not in avro:
        raise EventDecodeError(
            f"Avro type {str(kind)[:100]!r} has no Kafka Connect form walcast reads"
        )
    out = {"type": avro.get("connect.type") or _CONNECT_OF_AVRO[kind], "optional": False}
    _connect_attributes(avro, out)
    return out


def _connect_attributes(avro: dict[str, Any], out: dict[str, Any]) -> None:
    for key, attribute in _ATTRIBUTES:
        if attribute in avro:
            out[key] = avro[attribute]


def from_datum(connect: dict[str, Any], datum: Any) -> Any:
    """A datum read with :func:`avro_schema`'s schema as the JSON converter's value."""
    if datum is None:
        return None
    kind = connect["type"]
    if kind == "struct":
        return {f["field"]: from_datum(f, datum.get(f["field"])) for f in connect["fields"]}
    if kind == "array":
        return [from_datum(connect["items"], v) for v in datum]
    if kind == "map":
        return {k: from_datum(connect["values"], v) for k, v in datum.items()}
    if kind == "bytes":
        if isinstance(datum, Decimal):
            scale = limits.check_scale(int((connect.get("parameters") or {}).get("scale", "0")))
            if not datum.is_finite() or datum.adjusted() + scale > _MAX_UNSCALED_DIGITS:
                raise EventDecodeError(
                    "an Avro decimal that is not a finite number of at most"
                    f" {_MAX_UNSCALED_DIGITS} digits (Postgres' largest numeric)"
                )
            return base64.b64encode(twos_complement(int(datum.scaleb(scale)))).decode()
        return base64.b64encode(datum).decode()
    return datum
