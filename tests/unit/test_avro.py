"""walcast's change event in Avro (shared/avro.py): every kind of value comes back as the
JSON event carries it, the wire format is Confluent's, schemas are registered under the
chosen subject and evolve on DDL as the registry's compatibility rule allows — through
confluent-kafka's client, against the registry test double (tests/schema_registry.py)
and against the client's own ``mock://`` registry."""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest

from shared.avro import (
    RegistryDecoder,
    RegistryEncoder,
    event_schema,
    record_name,
    registry_client,
    subject,
    unframe,
)
from shared.contract.event import EventDecodeError, decode
from shared.errors import PermanentError
from tests.schema_registry import Registry, running

TYPES = {
    "id": "int4", "big": "int8", "amount": "numeric", "ratio": "float8", "flag": "bool",
    "blob": "bytea", "doc": "jsonb", "day": "date", "at": "timestamptz", "tags": "_text",
    "nums": "_int4", "Odd Name": "text", "mood": "mood_enum",
}  # fmt: skip
ROW = {
    "id": 1, "big": 9007199254740993, "amount": "12345678901234567890.0001", "ratio": "NaN",
    "flag": True, "blob": "AAH/", "doc": {"k": [1, 2.5, None]}, "day": "-0043-03-15",
    "at": "infinity", "tags": ["a", None, "b c"], "nums": [1, None], "Odd Name": "x",
    "mood": "happy",
}  # fmt: skip


def event(**overrides: Any) -> dict[str, Any]:
    ev = {"v": 1, "op": "insert", "db": "app", "schema": "public", "table": "t", "lsn": 100,
          "seq": 0, "commit_lsn": 100, "xid": 7, "commit_ts": "2024-01-01T00:00:00.000000Z",
          "key": {"id": 1}, "new": dict(ROW), "old": None, "types": dict(TYPES)}  # fmt: skip
    ev.update(overrides)
    return ev


@pytest.fixture
def registry() -> Iterator[tuple[Any, Registry]]:
    with running() as (url, state):
        yield registry_client(url), state


def roundtrip(client: Any, ev: dict[str, Any], topic: str = "walcast.cdc") -> dict[str, Any]:
    data = RegistryEncoder(client, "topic_record").encode(topic, ev)
    back = RegistryDecoder(client).decode(data)
    decode(back)  # the event contract accepts it
    out: dict[str, Any] = orjson.loads(back)
    return out


def test_every_kind_of_value_comes_back_as_the_json_event_carries_it(
    registry: tuple[Any, Registry],
) -> None:
    client, _ = registry
    ev = event(old=dict(ROW, ratio=0.5))
    assert roundtrip(client, ev) == orjson.loads(orjson.dumps(ev))


def test_unchanged_toast_snapshot_and_control_events(registry: tuple[Any, Registry]) -> None:
    client, _ = registry
    toast = event(op="update", new={"id": 1, "big": 2}, unchanged_toast=["doc", "blob"])
    back = roundtrip(client, toast)
    assert back["new"] == {k: ROW.get(k) if k in ("id",) else None for k in TYPES
                           if k not in ("doc", "blob")} | {"big": 2}  # fmt: skip
    assert back["unchanged_toast"] == ["doc", "blob"]
    read = roundtrip(client, event(op="read", snapshot={"id": 3, "chunk": 0}, epoch=2))
    assert (read["snapshot"], read["epoch"]) == ({"id": 3, "chunk": 0}, 2)
    ddl = {"tag": "ALTER TABLE", "columns": [{"name": "id", "type": "int4"}]}
    back = roundtrip(client, event(op="ddl", key={}, new=None, ddl=ddl))
    assert (back["ddl"], back["key"], back["new"]) == (ddl, {}, None)


def test_the_wire_format_is_confluents(registry: tuple[Any, Registry]) -> None:
    client, state = registry
    data = RegistryEncoder(client).encode("orders", event())
    magic, schema_id = struct.unpack(">bI", data[:5])
    assert (magic, schema_id) == (0, 1)
    schema = json.loads(state.schemas[schema_id])
    datum = fastavro.schemaless_reader(io.BytesIO(data[5:]), fastavro.parse_schema(schema), None)
    assert datum["new"]["Odd_Name"] == "x"  # a plain Avro reader, no walcast code
    assert list(state.subjects) == ["orders-value"]
    with pytest.raises(EventDecodeError, match="magic byte"):
        unframe(b'{"v":1}')


@pytest.mark.parametrize(
    ("strategy", "want"),
    [("topic", "cdc-value"), ("record", "walcast.app.public.t.Event"),
     ("topic_record", "cdc-walcast.app.public.t.Event")],
)  # fmt: skip
def test_subject_name_strategies(strategy: Any, want: str) -> None:
    assert subject(strategy, "cdc", record_name("app", "public", "t")) == want


def test_a_column_added_evolves_the_schema_a_type_change_is_refused(
    registry: tuple[Any, Registry],
) -> None:
    client, state = registry
    enc = RegistryEncoder(client)
    enc.encode("t", event())
    wider = event(types={**TYPES, "note": "text"}, new={**ROW, "note": "n"})
    second = enc.encode("t", wider)
    assert state.subjects["t-value"] == [1, 2]  # a new version, accepted (BACKWARD)
    assert orjson.loads(RegistryDecoder(client).decode(second))["new"]["note"] == "n"
    retyped = event(types={**TYPES, "flag": "int4"}, new={**ROW, "flag": 1})
    with pytest.raises(PermanentError, match="refused the new schema of subject 't-value'") as e:
        enc.encode("t", retyped)
    assert "compatibility" in (e.value.hint or "")
    state.levels["t-value"] = "NONE"  # what the operator does, then restarts
    enc.encode("t", retyped)
    assert len(state.subjects["t-value"]) == 3


def test_the_clients_mock_registry_suffices_for_encoding_and_decoding() -> None:
    client = registry_client("mock://walcast-unit")
    ev = event()
    assert orjson.loads(RegistryDecoder(client).decode(RegistryEncoder(client).encode("m", ev))) \
        == orjson.loads(orjson.dumps(ev))  # fmt: skip


def test_records_that_are_not_walcast_events_are_refused(registry: tuple[Any, Registry]) -> None:
    client, _ = registry
    from confluent_kafka.schema_registry import Schema

    other = {"type": "record", "name": "Thing", "namespace": "acme", "fields": []}
    sid = client.register_schema("x-value", Schema(json.dumps(other), "AVRO"))
    with pytest.raises(
        EventDecodeError, match="neither a walcast change event nor a Kafka Connect record"
    ):
        RegistryDecoder(client).decode(struct.pack(">bI", 0, sid))
    with pytest.raises(PermanentError, match="multi-dimensional"):
        RegistryEncoder(client).encode("t", event(new={**ROW, "nums": [[1, 2], [3, 4]]}))


def test_schema_names_and_fields_are_valid_avro() -> None:
    schema = event_schema("my-db", "1st schema", "t.x", TYPES, ["id"])
    fastavro.parse_schema(schema)  # raises on an invalid name
    assert schema["namespace"] == "walcast.my_db._1st_schema.t_x"


def test_the_producers_pre_encoded_rows_and_a_ddl_evolve_the_schema(
    registry: tuple[Any, Registry],
) -> None:
    """pg2kafka holds key, rows and types as encoded JSON (orjson fragments); a DDL event
    carries the table's new columns: its schema is registered when the DDL comes, and a
    truncate after it is written with the table's last schema."""
    client, state = registry
    enc = RegistryEncoder(client)
    frag = {k: orjson.Fragment(orjson.dumps(v)) for k, v in event().items()
            if k in ("key", "new", "types")}  # fmt: skip
    data = enc.encode("f", event(**frag))
    assert orjson.loads(RegistryDecoder(client).decode(data)) == orjson.loads(orjson.dumps(event()))
    columns = [{"name": n, "type": t} for n, t in {**TYPES, "extra": "text"}.items()]
    ddl = event(op="ddl", key={}, new=None, types=None,
                ddl={"tag": "ALTER TABLE", "columns": columns, "primary_key": ["id"]})  # fmt: skip
    del ddl["types"]
    enc.encode("f", ddl)
    assert len(state.subjects["f-value"]) == 2  # the DDL registered the new schema
    truncate = event(op="truncate", key={}, new=None)
    del truncate["types"]
    enc.encode("f", truncate)
    assert len(state.subjects["f-value"]) == 2  # no new version for a truncate


def test_json_columns_keep_their_exact_text_and_partial_images_stay_partial(
    registry: tuple[Any, Registry],
) -> None:
    """From pg2kafka's pre-encoded rows a json value's numbers stay exact (no float
    round trip); an empty key and a key-only old image come back as they went."""
    client, _ = registry
    doc = b'{"big": 12345678901234567890123, "dec": 1.10}'
    new = orjson.Fragment(b'{"id": 1, "doc": ' + doc + b', "tags": ["a"]}')
    ev = event(new=new, types={"id": "int4", "doc": "jsonb", "tags": "_text"},
               old={"id": 0}, op="update")  # fmt: skip
    back = RegistryDecoder(client).decode(RegistryEncoder(client).encode("x", ev))
    assert doc in back  # the JSON's text, byte for byte
    out = orjson.loads(back)
    assert out["old"] == {"id": 0}  # the key-only image: no nulls for absent columns
    control = event(op="truncate", key={}, new=None)
    assert (
        orjson.loads(RegistryDecoder(client).decode(RegistryEncoder(client).encode("x", control)))[
            "key"
        ]
        == {}
    )


def test_an_unknown_schema_id_is_an_unreadable_record(registry: tuple[Any, Registry]) -> None:
    client, _ = registry
    with pytest.raises(EventDecodeError, match="schema id 999 is unknown"):
        RegistryDecoder(client).decode(struct.pack(">bI", 0, 999))


def test_debezium_records_in_avro_read_back_as_the_json_converters(
    registry: tuple[Any, Registry],
) -> None:
    """The real connector's records (tests/unit/data), keys and values, through the
    Connect encoder and the registry: read back, the JSON converter's records again;
    subjects <topic>-key / <topic>-value."""
    from shared.avro import ConnectRegistryEncoder

    client, state = registry
    data = json.loads((Path(__file__).parent / "data" / "debezium_3.7.0_types.json").read_text())
    enc, dec = ConnectRegistryEncoder(client), RegistryDecoder(client)
    for key, value in data["records"][:3]:
        assert orjson.loads(dec.decode(enc.encode("dbz", key, key=True))) == key
        assert orjson.loads(dec.decode(enc.encode("dbz", value))) == value
    assert sorted(state.subjects) == ["dbz-key", "dbz-value"]


def test_a_debezium_tables_new_column_evolves_its_subject_a_retyped_one_is_refused(
    registry: tuple[Any, Registry],
) -> None:
    """Debezium writes no DDL: a table's Avro schema changes with the first record that
    carries the new columns, and the registry's rule decides then (BACKWARD: an optional
    column added passes, a column's type changed does not)."""
    from shared.avro import ConnectRegistryEncoder

    client, state = registry
    enc = ConnectRegistryEncoder(client)

    def value(*fields: dict[str, Any]) -> dict[str, Any]:
        row = {
            "type": "struct",
            "optional": True,
            "name": "p.s.t.Value",
            "fields": [{"type": "int32", "optional": False, "field": "id"}, *fields],
        }
        return {"schema": {"type": "struct", "optional": False, "name": "p.s.t.Envelope",
                           "fields": [{**row, "field": "after"}]},
                "payload": {"after": {"id": 1, **{f["field"]: None for f in fields}}}}  # fmt: skip

    enc.encode("p.s.t", value())
    enc.encode("p.s.t", value({"type": "string", "optional": True, "field": "note"}))
    assert len(state.subjects["p.s.t-value"]) == 2
    with pytest.raises(PermanentError, match="refused the new schema"):
        enc.encode("p.s.t", value({"type": "int64", "optional": True, "field": "note"}))
