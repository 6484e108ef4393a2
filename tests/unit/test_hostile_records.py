"""Hostile records (issue 36, finding 3): the exact records of the report, each refused
as an unreadable record with a reason naming the limit — or decoded, where the value is
one Postgres can hold — by every decoder; through the consumer loop each becomes a dead
letter and the next record is applied; kafka2spark's translation returns the reason."""

from __future__ import annotations

import io
import json
import re
import struct
from typing import Any

import fastavro
import orjson
import pytest
from confluent_kafka.schema_registry import Schema

from shared.avro import RegistryDecoder, frame, registry_client
from shared.contract.event import EventDecodeError, decode
from shared.errors import RetriableError
from shared.formats.debezium_input import events, translate
from tests.unit.test_consumer_loop import TOPIC, Msg, committed, make_loop


def _nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "int32"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def debezium(field: dict[str, Any], value: Any) -> tuple[bytes, bytes]:
    """A Debezium insert (JSON with schemas) of a row (id, x): ``x`` of ``field``."""
    columns = [{"type": "int32", "optional": False, "field": "id"},
               {**field, "optional": True, "field": "x"}]  # fmt: skip
    row = {"type": "struct", "fields": columns, "optional": True}
    record = {
        "schema": {"type": "struct", "fields": [{**row, "field": "before"},
                                                {**row, "field": "after"}]},
        "payload": {"before": None, "after": {"id": 1, "x": value}, "op": "c",
                    "source": {"db": "d", "schema": "s", "table": "t", "lsn": 100, "txId": 5,
                               "ts_us": 1_700_000_000_000_000}},
    }  # fmt: skip
    # the standard library's encoder: orjson's stops at 255 levels
    return orjson.dumps({"id": 1}), json.dumps(record).encode()


SCALE = debezium(
    {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "fields": []},
    {"scale": -(10**15), "value": "AQ=="},
)
BITS = debezium(
    {"type": "bytes", "name": "io.debezium.data.Bits", "parameters": {"length": str(10**15)}},
    "AQ==",
)
ARRAYS_600 = debezium(_nested_schema(600), _nested(600))
VALUE_600 = debezium(_nested_schema(1), _nested(600))
JSON_300 = debezium({"type": "string", "name": "io.debezium.data.Json"}, "[" * 300 + "]" * 300)
JSON_2000 = debezium({"type": "string", "name": "io.debezium.data.Json"}, "[" * 2000 + "]" * 2000)

REFUSED = [
    pytest.param(SCALE, r"decimal scale -1000000000000000 is beyond ±16383", id="scale-1e15"),
    pytest.param(BITS, r"bit string length '1000000000000000'… is beyond 83886080", id="bits-1e15"),
    pytest.param(ARRAYS_600, r"arrays nested deeper than 6 dimensions", id="arrays-600"),
    pytest.param(VALUE_600, r"nested deeper than 512 levels", id="value-600"),
    pytest.param(JSON_2000, r"column 'x'.*depth limit exceeded", id="json-2000"),
]


@pytest.mark.parametrize(("record", "reason"), REFUSED)
def test_the_reports_hostile_debezium_records_are_unreadable_with_the_limit_named(
    record: tuple[bytes, bytes], reason: str
) -> None:
    with pytest.raises(EventDecodeError, match=reason):
        translate(*record)


def test_a_json_value_300_levels_deep_is_a_value_postgres_holds_and_decodes() -> None:
    (out,) = translate(*JSON_300)
    row = decode(out).row()
    assert row is not None
    assert row["x"] == json.loads("[" * 300 + "]" * 300)


def test_a_hstore_in_map_mode_reads_as_a_json_object() -> None:
    field = {"type": "map", "keys": {"type": "string"}, "values": {"type": "string",
             "optional": True}}  # fmt: skip
    (ev,) = events(*debezium(field, {"a": "1", "b": None}))
    assert ev["new"]["x"] == {"a": "1", "b": None}
    assert ev["types"]["x"] == "jsonb"


def _hstore_avro(client: Any) -> bytes:
    """A Debezium value in Avro as Confluent's AvroConverter writes an hstore column in
    ``map`` mode: an Avro map (registered as is, not through walcast's encoder)."""
    row = {"type": "record", "name": "Value", "namespace": "dbz.public.t",
           "connect.name": "dbz.public.t.Value", "fields": [
               {"name": "id", "type": "int"},
               {"name": "h", "type": ["null", {"type": "map", "values": ["null", "string"]}],
                "default": None}]}  # fmt: skip
    source = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
              "connect.name": "io.debezium.connector.postgresql.Source", "fields": [
                  {"name": f, "type": "string"} for f in ("db", "schema", "table")] + [
                  {"name": "lsn", "type": ["null", "long"], "default": None}]}  # fmt: skip
    envelope = {"type": "record", "name": "Envelope", "namespace": "dbz.public.t",
                "connect.name": "dbz.public.t.Envelope", "fields": [
                    {"name": "before", "type": ["null", row], "default": None},
                    {"name": "after", "type": ["null", "dbz.public.t.Value"], "default": None},
                    {"name": "source", "type": source},
                    {"name": "op", "type": "string"}]}  # fmt: skip
    schema_id = client.register_schema("dbz.public.t-value", Schema(json.dumps(envelope), "AVRO"))
    out = io.BytesIO()
    datum = {"before": None, "after": {"id": 1, "h": {"a": "1", "b": None}},
             "source": {"db": "d", "schema": "public", "table": "t", "lsn": 100},
             "op": "c"}  # fmt: skip
    fastavro.schemaless_writer(out, fastavro.parse_schema(envelope), datum)
    return frame(int(schema_id), out.getvalue())


def test_an_avro_map_field_decodes_instead_of_raising_key_error() -> None:
    client = registry_client("mock://hostile-map")
    value = RegistryDecoder(client).decode(_hstore_avro(client))
    (ev,) = events(None, value)
    assert ev["new"] == {"id": 1, "h": {"a": "1", "b": None}}


def test_an_avro_schema_whose_items_take_no_bytes_is_refused() -> None:
    client = registry_client("mock://hostile-nulls")
    schema = {"type": "record", "name": "Value", "namespace": "dbz.s.t", "connect.name": "x",
              "fields": [{"name": "n", "type": {"type": "array", "items": "null"}}]}  # fmt: skip
    schema_id = client.register_schema("nulls-value", Schema(json.dumps(schema), "AVRO"))
    claim = struct.pack("B", 0xFE) + b"\xff" * 8 + b"\x01"  # a block of ~2^62 nulls
    with pytest.raises(EventDecodeError, match="items that take no bytes"):
        RegistryDecoder(client).decode(frame(int(schema_id), claim))


# -- through the consumer loop (kafka2search, kafka2webhook) ----------------------------------


def _ok(lsn: int) -> bytes:
    return orjson.dumps({"v": 1, "op": "insert", "db": "d", "schema": "s", "table": "t",
                         "lsn": lsn, "key": {"id": lsn}, "new": {"id": lsn}})  # fmt: skip


@pytest.mark.parametrize(
    "record", [SCALE, BITS, ARRAYS_600, VALUE_600, JSON_2000], ids=lambda r: str(len(r[1]))
)
def test_the_loop_dead_letters_a_hostile_record_and_applies_the_next(
    record: tuple[bytes, bytes],
) -> None:
    loop, sink, consumer, dead = make_loop(input_format="auto")
    loop.handle(Msg(0, 0, record[1], record[0]))
    loop.handle(Msg(0, 1, _ok(7)))
    loop.flush()
    assert [(offset, kind) for offset, kind, _ in dead.sent] == [(0, "poison")]
    assert sink.log == [("write", [7])]
    assert committed(consumer) == {(TOPIC, 0): 2}  # past both


def test_any_decoder_failure_is_a_dead_letter_a_registry_outage_is_not() -> None:
    loop, _sink, _consumer, dead = make_loop()

    def broken(_msg: Any) -> Any:
        raise KeyError("h")

    loop.decoder = broken
    loop.handle(Msg(0, 0, b"{}"))
    ((offset, kind, reason),) = dead.sent
    assert (offset, kind) == (0, "poison")
    assert reason == "unreadable record (the decoder failed: KeyError: no entry 'h')"

    def down(_msg: Any) -> Any:
        raise RetriableError("schema registry: unreachable")

    loop.decoder = down
    with pytest.raises(RetriableError):
        loop.handle(Msg(0, 1, b"{}"))

    def stop(_msg: Any) -> Any:
        raise KeyboardInterrupt

    loop.decoder = stop
    with pytest.raises(KeyboardInterrupt):
        loop.handle(Msg(0, 2, b"{}"))
    assert len(dead.sent) == 1


# -- kafka2spark's translation -------------------------------------------------------------


@pytest.mark.parametrize(("record", "reason"), REFUSED)
def test_kafka2sparks_translation_returns_the_reason_for_the_quarantine(
    record: tuple[bytes, bytes], reason: str
) -> None:
    from services.kafka2spark.envelope import _translate_record

    values, why = _translate_record("debezium", None, *record)
    assert values is None
    assert why is not None
    assert re.search(reason, why)
