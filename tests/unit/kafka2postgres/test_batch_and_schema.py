"""kafka2postgres's batch reduction (the newest change per key, unchanged TOAST values
taken from the other change of the key) and the schema it builds tables from (a type
name from a record is checked before it reaches any statement)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from services.kafka2postgres.batch import Batch
from services.kafka2postgres.schema import (
    ROW_ID,
    SchemaError,
    TableSchema,
    check_sql_type,
    sql_type_of,
)
from shared.contract.event import decode
from shared.interfaces import Origin

SOURCE = ("db", "public", "t")


def event(op: str, lsn: int, key: int, new: Any = None, **extra: Any) -> Any:
    ev: dict[str, Any] = {
        "v": 1, "op": op, "db": "db", "schema": "public", "table": "t", "lsn": lsn, "seq": 0,
        "commit_lsn": lsn, "xid": 7, "commit_ts": "2024-01-01T00:00:00+00:00",
        "key": {"id": key}, "types": {"id": "int4", "v": "text", "big": "text"}, **extra,
    }  # fmt: skip
    if new is not None:
        ev["new"] = new
    raw = orjson.dumps(ev)
    return decode(raw), Origin("t", 0, lsn, None, raw)


def fold(*events: Any) -> Batch:
    b = Batch()
    for ev, origin in events:
        b.add(SOURCE, ev, origin)
    return b


def rows(b: Batch) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = orjson.loads(b.tables[SOURCE].elements())
    return out


def test_the_newest_change_per_key_wins_whatever_the_arrival_order() -> None:
    b = fold(
        event("insert", 10, 1, {"id": 1, "v": "a", "big": "B"}),
        event("update", 30, 1, {"id": 1, "v": "c", "big": "B"}),
        event("read", 20, 1, {"id": 1, "v": "b", "big": "B"}),  # a snapshot row, later
        event("delete", 40, 2),
        event("insert", 35, 2, {"id": 2, "v": "x", "big": None}),
    )
    got = {r["r"]["id"]: r for r in rows(b)}
    assert got[1]["v"] == 30
    assert got[1]["r"]["v"] == "c"
    assert got[1]["d"] is False
    assert got[2]["v"] == 40
    assert got[2]["d"] is True
    assert got[2]["r"] == {"id": 2}
    assert b.records == 5
    assert len(b) == 2
    assert len(b.tables[SOURCE].origins) == 5  # every record, for its dead letter


def test_an_unchanged_toast_value_comes_from_the_other_change_of_the_key() -> None:
    b = fold(
        event("insert", 10, 1, {"id": 1, "v": "a", "big": {"exact": "json text"}}),
        event("update", 20, 1, {"id": 1, "v": "b"}, unchanged_toast=["big"]),
    )
    (r,) = rows(b)
    assert r["u"] is None
    assert r["r"] == {"id": 1, "v": "b", "big": {"exact": "json text"}}
    # the value's own text is kept byte for byte (a json column's exact text)
    assert b'"big":{"exact":"json text"}' in b.tables[SOURCE].changes[b'{"id":1}'].row


def test_an_older_row_arriving_later_is_kept_apart_to_fill_only_what_the_target_lacks() -> None:
    # A redelivered insert from before the table was dropped and created again, or a row
    # from before an update an earlier batch applied: its value is not the current one, so
    # it never goes into the newer change (the target keeps what it holds); it is the
    # key's filler, applied after the batch, filling only columns the target has no value
    # for (a snapshot's read row behind a partial update of a row the target lacks).
    b = fold(
        event("update", 20, 1, {"id": 1, "v": "new"}, unchanged_toast=["big"]),
        event("insert", 5, 1, {"id": 1, "v": "older", "big": None}),
        event("read", 10, 1, {"id": 1, "v": "old"}, unchanged_toast=["big"]),
        event("read", 8, 2, {"id": 2, "v": "x", "big": "y"}),
        event("update", 9, 2, {"id": 2, "v": "z", "big": "w"}),
    )
    (r1, r2) = rows(b)
    assert r1["v"] == 20
    assert r1["r"] == {"id": 1, "v": "new"}
    assert r1["u"] == ["big"]
    assert r2["r"] == {"id": 2, "v": "z", "big": "w"}  # in the stream's order: no filler
    (f,) = orjson.loads(b.tables[SOURCE].filler_elements())
    # the newest older row, completed by the older ones (none is newer than the change)
    assert f["v"] == 10
    assert f["r"] == {"id": 1, "v": "old", "big": None}
    assert f["u"] is None


def test_an_older_delete_or_an_older_row_behind_a_whole_change_is_dropped_as_stale() -> None:
    b = fold(
        event("update", 20, 1, {"id": 1, "v": "new"}, unchanged_toast=["big"]),
        event("delete", 10, 1),
        event("update", 30, 2, {"id": 2, "v": "whole", "big": "b"}),
        event("read", 10, 2, {"id": 2, "v": "old", "big": "a"}),
    )
    assert [r["r"]["v"] for r in rows(b)] == ["new", "whole"]
    assert b.tables[SOURCE].fillers == {}


def test_a_partial_row_with_nothing_to_fill_it_says_which_columns_it_lacks() -> None:
    b = fold(event("update", 20, 1, {"id": 1, "v": "new"}, unchanged_toast=["big"]))
    (r,) = rows(b)
    assert r["u"] == ["big"]
    assert "big" not in r["r"]


@pytest.mark.parametrize(
    "text",
    ["integer", "numeric(8,2)", "character varying(10)", "timestamp(3) with time zone",
     "double precision", "integer[]", "text[][]", 'public."Mood"', "interval day to second(3)",
     '"char"', "bit varying(5)", 'my_schema."odd ""name"""[]'],
)  # fmt: skip
def test_type_names_as_format_type_writes_them_pass(text: str) -> None:
    assert check_sql_type(text, "c") == text


@pytest.mark.parametrize(
    "text",
    ["int; DROP TABLE x", "text DEFAULT 'x'", "int -- comment", "numeric(8,2) NOT NULL",
     "int)", "text COLLATE \"C\"", "", "a.b.c", "int[1]", "varchar(10) /* x */"],
)  # fmt: skip
def test_anything_else_in_a_type_name_is_refused(text: str) -> None:
    with pytest.raises(SchemaError, match="not a Postgres type name"):
        check_sql_type(text, "c")


def test_a_schema_from_row_types_and_from_a_ddl_event() -> None:
    s = TableSchema.from_types({"id": "int4", "tags": "_text", "Odd": "MyEnum"}, ["id"])
    assert [c.sql_type for c in s.columns] == ["int4", "text[]", '"MyEnum"']
    assert not s.exact
    ddl = {"columns": [{"name": "id", "type": "int4", "sql_type": "integer", "num": 1},
                       {"name": "p", "type": "numeric", "sql_type": "numeric(8,2)", "num": 3}],
           "primary_key": ["id"]}  # fmt: skip
    d = TableSchema.from_ddl(ddl)
    assert d.exact
    assert d.numbers() == {"id": 1, "p": 3}
    assert d.key == ("id",)
    with pytest.raises(SchemaError, match="key column"):
        TableSchema.from_ddl({**ddl, "primary_key": ["nope"]})
    assert sql_type_of("_int4") == "int4[]"


def appended(lsn: int, seq: int, new: dict[str, Any]) -> Any:
    """A row of an insert-only table: no key, ``append_only``."""
    ev: dict[str, Any] = {
        "v": 1, "op": "insert", "db": "db", "schema": "public", "table": "t", "lsn": lsn,
        "seq": seq, "commit_lsn": lsn, "xid": 7, "commit_ts": "2024-01-01T00:00:00+00:00",
        "key": {}, "append_only": True, "types": {"a": "int4", "b": "text"}, "new": new,
    }  # fmt: skip
    raw = orjson.dumps(ev)
    return decode(raw), Origin("t", 0, lsn, None, raw)


def test_rows_of_an_insert_only_table_are_keyed_by_their_row_id_held_last() -> None:
    twin = {"a": 1, "b": "same"}
    b = fold(appended(10, 0, twin), appended(10, 1, twin), appended(10, 1, twin),
             appended(12, 0, {}))  # fmt: skip
    tb = b.tables[SOURCE]
    assert tb.key == [ROW_ID]
    assert list(tb.types) == ["a", "b", ROW_ID]  # the row id last
    got = [r["r"] for r in rows(b)]
    # two equal rows stay two; the redelivered one is one
    assert got == [{**twin, ROW_ID: "10.0"}, {**twin, ROW_ID: "10.1"}, {ROW_ID: "12.0"}]
    schema = TableSchema.from_types(tb.types, tb.key)
    assert schema.appended
    assert (schema.names, schema.key) == (["a", "b", ROW_ID], (ROW_ID,))
    plain = schema.without_row_id()
    assert (plain.names, plain.key, plain.appended) == (["a", "b"], (), False)
    assert plain.with_row_id() == schema


def test_an_insert_only_row_with_a_column_named_like_the_row_id_is_refused_with_why() -> None:
    from prometheus_client import CollectorRegistry

    from services.kafka2postgres.applier import Applier
    from services.kafka2postgres.metrics import Metrics
    from services.kafka2postgres.settings import Kafka2PostgresSettings

    applier = Applier(Kafka2PostgresSettings(), Metrics(CollectorRegistry()), lambda _s: None)
    b = applier.new_batch()
    ev, origin = appended(10, 0, {"a": 1, "b": "x"})
    assert applier.add(b, ev, origin) is None  # an ordinary one is taken
    raw = orjson.loads(origin.value)
    raw["types"] = {"a": "int4", ROW_ID: "text"}
    raw["new"] = {"a": 1, ROW_ID: "mine"}
    clash = orjson.dumps(raw)
    reason = applier.add(b, decode(clash), Origin("t", 0, 11, None, clash))
    assert reason is not None
    assert ROW_ID in reason
    assert len(b) == 1


def test_an_insert_only_row_without_its_ids_parts_is_refused_and_one_older_than_a_key_skipped() -> (
    None
):
    from prometheus_client import CollectorRegistry

    from services.kafka2postgres.applier import Applier
    from services.kafka2postgres.metrics import Metrics
    from services.kafka2postgres.settings import Kafka2PostgresSettings
    from services.kafka2postgres.tables import TargetTable
    from shared.contract.moves import Moves

    applier = Applier(Kafka2PostgresSettings(), Metrics(CollectorRegistry()), lambda _s: None)
    b = applier.new_batch()
    ev, origin = appended(10, 0, {"a": 1, "b": "x"})
    raw = orjson.loads(origin.value)
    del raw["commit_lsn"]
    broken = orjson.dumps(raw)
    reason = applier.add(b, decode(broken), Origin("t", 0, 1, None, broken))
    assert reason is not None
    assert "commit_lsn" in reason
    # the table gained a key at version 20: an older insert-only row is skipped, a newer
    # one (the key lost again) refused with the reason
    keyed = TableSchema.from_types({"a": "int4", "b": "text"}, ["a"])
    source = ("db", "public", "t")
    applier.tables.by_source[source] = TargetTable(
        1, source, "public", "t", True, -1, 20, keyed, Moves((), 0), None
    )
    assert applier.add(b, ev, origin) is None
    assert len(b) == 0
    later, later_origin = appended(30, 0, {"a": 2, "b": "y"})
    refused = applier.add(b, later, later_origin)
    assert refused is not None
    assert "keyed" in refused
