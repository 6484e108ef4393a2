"""Debezium records in Avro (shared/formats/debezium_avro.py), on the real connector's
captured records (3.7.0, tests/unit/data): every key and value — 32 column types, an
insert, an update, a delete — written with fastavro under the converted schema and read
back is the very record again, schema and payload; and the schemas are what Confluent's
AvroData makes of Connect's (names, logical decimals, connect.* attributes)."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest

from shared.formats.debezium_avro import avro_schema, connect_schema, from_datum, to_datum

DATA = json.loads(
    (Path(__file__).parent / "data" / "debezium_3.7.0_types.json").read_text(encoding="utf-8")
)
PARTS = [(i, part) for i, r in enumerate(DATA["records"]) for part in (0, 1) if r[part]]


def roundtrip(record: dict[str, Any]) -> dict[str, Any]:
    schema = avro_schema(record["schema"])
    parsed = fastavro.parse_schema(schema)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, to_datum(record["schema"], record["payload"]))
    datum = fastavro.schemaless_reader(io.BytesIO(out.getvalue()), parsed, None)
    connect = {**connect_schema(schema), "optional": record["schema"].get("optional", False)}
    return {"schema": connect, "payload": from_datum(connect, datum)}


@pytest.mark.parametrize(("index", "part"), PARTS)
def test_the_connectors_records_survive_avro(index: int, part: int) -> None:
    record = DATA["records"][index][part]
    assert roundtrip(record) == record


def test_schemas_follow_avrodatas_rules() -> None:
    value = DATA["records"][0][1]
    schema = avro_schema(value["schema"])
    assert (schema["namespace"], schema["name"]) == (
        value["schema"]["name"].rsplit(".", 1)[0], "Envelope")  # fmt: skip
    fields = {f["name"]: f for f in schema["fields"]}
    after = fields["after"]["type"][1]
    assert fields["before"]["type"][1]["name"] == "Value"
    assert after == fields["before"]["type"][1]["namespace"] + ".Value"  # a reference
    columns = {f["name"]: f["type"] for f in fields["before"]["type"][1]["fields"]}
    assert columns["n"][1] == {
        "type": "bytes", "logicalType": "decimal", "scale": 2, "precision": 10,
        "connect.name": "org.apache.kafka.connect.data.Decimal", "connect.version": 1,
        "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
    }  # fmt: skip
    assert columns["s"][1] == {"type": "int", "connect.type": "int16"}
    snapshot = next(f for f in fields["source"]["type"]["fields"] if f["name"] == "snapshot")
    assert (snapshot["type"][1], snapshot["default"]) == ("null", "false")  # default first
    datum = to_datum(value["schema"], value["payload"])
    assert datum["after"]["n"] == Decimal("12345.67")
