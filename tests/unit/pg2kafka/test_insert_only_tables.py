"""Keyless insert-only tables (filters.keyless_tables=inserts): the events' flag, the
snapshot's query and frame, the settings, and the Avro envelope."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import fastavro
import orjson
import pytest
from psycopg import sql
from pydantic import ValidationError

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder, append_only, set_epoch
from services.pg2kafka.settings import FilterSettings, Pg2KafkaSettings, inserts_publication
from services.pg2kafka.snapshots.chunks import chunk_query, pg_json_frame
from services.pg2kafka.types import TypeRegistry
from shared.avro import event_from_avro, event_schema, event_to_avro
from shared.contract import rowhash
from shared.contract.event import FIELDS, ChangeEvent, decode

KEYED = pg.Relation(16384, "app", "users", "d", (pg.Column("id", 23, -1, True),
                                                 pg.Column("name", 25, -1, False)))  # fmt: skip
NOKEY = pg.Relation(16385, "app", "log", "d", (pg.Column("line", 25, -1, False),))
NOTHING = pg.Relation(16386, "app", "audit", "n", (pg.Column("id", 23, -1, False),))
FULL = pg.Relation(16387, "app", "full", "f", (pg.Column("a", 23, -1, True),))


def builder() -> EventBuilder:
    b = EventBuilder("db1", TypeRegistry())
    for rel in (KEYED, NOKEY, NOTHING, FULL):
        b.relation(rel)
    b.begin(pg.Begin(500, 1_700_000_000_000_000, 77))
    return b


def encoded(ev: ChangeEvent) -> dict[str, Any]:
    out: dict[str, Any] = orjson.loads(orjson.dumps(ev))
    return out


@pytest.mark.parametrize(
    ("rel", "flag"),
    [(KEYED, False), (NOKEY, True), (NOTHING, True), (FULL, False)],
    ids=["primary-key", "default-without-key", "identity-nothing", "full"],
)
def test_append_only_is_a_relation_without_any_replica_identity_column(
    rel: pg.Relation, flag: bool
) -> None:
    assert append_only(rel) is flag


def test_inserts_of_a_keyless_table_are_flagged_and_others_are_not() -> None:
    b = builder()
    (log_ev,) = b.change(pg.Insert(16385, ("hello",)), 400)
    (user_ev,) = b.change(pg.Insert(16384, ("1", "ann")), 401)
    (full_ev,) = b.change(pg.Insert(16387, ("1",)), 402)
    log_row = encoded(log_ev)
    assert (log_row["key"], log_row["new"], log_row["append_only"]) == ({}, {"line": "hello"}, True)
    assert "append_only" not in encoded(user_ev)
    assert "append_only" not in encoded(full_ev)
    # the contract's view gives the row its position-derived identity
    view = decode(orjson.dumps(log_ev))
    assert view.row_id() == "500.0"
    assert decode(orjson.dumps(user_ev)).row_id() is None
    # the producer's field order, with and without an epoch
    assert list(log_row) == [f for f in FIELDS if f in log_row]
    set_epoch(log_ev, 3)
    again = encoded(log_ev)
    assert (again["epoch"], again["append_only"]) == (3, True)
    assert list(again) == [f for f in FIELDS if f in again]


def test_read_rows_of_a_keyless_table_are_flagged() -> None:
    b = builder()
    ev = b.read(NOKEY, ("x",), 99, 4, "2024-01-01T00:00:00.000000Z", {"id": 7, "chunk": 2})
    set_epoch(ev, 2)
    row = encoded(ev)
    assert (row["op"], row["key"], row["append_only"], row["epoch"]) == ("read", {}, True, 2)
    assert list(row) == [f for f in FIELDS if f in row]
    assert decode(orjson.dumps(ev)).row_id() == f"{(2 << 48) | 99}.4.s7.2"
    keyed = encoded(b.read(KEYED, ("1", "a"), 99, 0, "2024-01-01T00:00:00.000000Z",
                           {"id": 7, "chunk": 0}))  # fmt: skip
    assert "append_only" not in keyed


@pytest.mark.parametrize("epoch", [0, 5])
def test_the_fast_snapshot_path_writes_the_same_event_as_the_builder(epoch: int) -> None:
    """Postgres writes the row's JSON on the fast path: the frame around it must give
    the same event, append_only included."""
    b = builder()
    info: Any = {"id": 7, "chunk": 1}
    head, middle, hash_field, tail = pg_json_frame("db1", NOKEY, 99, "2024-01-01T00:00:00.000000Z",
                                                   info, b, epoch, append_only=True)  # fmt: skip
    row_hash = str(rowhash.row_hash([("line", "x")])).encode()  # what Postgres computes
    fast = orjson.loads(head + b"3" + middle + b"{}" + b',"new":' + b'{"line":"x"}' + hash_field
                        + row_hash + tail)  # fmt: skip
    slow = b.read(NOKEY, ("x",), 99, 3, "2024-01-01T00:00:00.000000Z", info)
    set_epoch(slow, epoch)
    assert fast == encoded(slow)
    assert list(fast) == list(encoded(slow))


def test_an_insert_only_chunk_is_read_in_ctid_order() -> None:
    where = sql.SQL("ctid >= '(0,0)'::tid")
    name = sql.Identifier("app", "log")
    for fast in (False, True):
        ordered = chunk_query(name, NOKEY, where, fast, by_ctid=True).as_string(None)
        plain = chunk_query(name, NOKEY, where, fast).as_string(None)
        assert "ORDER BY ctid" in ordered
        assert "ORDER BY" not in plain


def test_keyless_tables_stream_as_inserts_by_default() -> None:
    assert FilterSettings().keyless_tables == "inserts"
    assert inserts_publication("walcast") == "walcast_ins"
    for mode in ("skip", "full_identity", "inserts"):
        assert FilterSettings(keyless_tables=mode).keyless_tables == mode
    with pytest.raises(ValidationError):
        FilterSettings(keyless_tables="append")


def test_a_publication_name_too_long_for_its_insert_only_companion_is_refused() -> None:
    with pytest.raises(ValidationError, match="63 bytes"):
        Pg2KafkaSettings.model_validate({"replication": {"publication": "p" * 60}})
    assert Pg2KafkaSettings.model_validate({"replication": {"publication": "p" * 59}})
    assert Pg2KafkaSettings.model_validate(
        {"replication": {"publication": "p" * 63}, "filters": {"keyless_tables": "skip"}}
    )
    with pytest.raises(ValidationError, match="insert-only publication"):
        Pg2KafkaSettings.model_validate(
            {"subscriptions": {"enabled": True, "publication": "walcast_ins"}}
        )


def test_avro_carries_append_only_and_leaves_it_out_when_absent() -> None:
    types = {"line": "text"}
    schema = event_schema("db1", "app", "log", types, [])
    parsed = fastavro.parse_schema(schema)
    base = {"v": 1, "op": "insert", "db": "db1", "schema": "app", "table": "log", "lsn": 5,
            "seq": 0, "commit_lsn": 5, "xid": 1, "commit_ts": "2024-01-01T00:00:00.000000Z",
            "key": {}, "new": {"line": "x"}, "old": None, "types": types}  # fmt: skip
    for ev, flag in ((base | {"append_only": True}, True), (base, None)):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, event_to_avro(ev, schema))
        buf.seek(0)
        datum = fastavro.schemaless_reader(buf, parsed, None)
        assert datum["append_only"] is flag
        back = event_from_avro(datum, schema)
        assert back.get("append_only") is flag


def test_the_migration_keeps_the_two_publications_disjoint() -> None:
    """What can be checked without a server: the migration is idempotent in form and
    moves a table in both directions (the integration tests run it)."""
    text = (Path(__file__).resolve().parents[3] / "sql/pg2kafka/V017__insert_only_tables.sql"
            ).read_text()  # fmt: skip
    assert "ADD COLUMN IF NOT EXISTS inserts_publication" in text
    assert "CHECK (keyless IN ('skip', 'full_identity', 'inserts'))" in text
    assert text.count("ALTER PUBLICATION %I DROP TABLE") == 3  # ins on key; main, ins on none
    assert "on_ddl_command_end" not in text.split("-- Idempotent.")[1]  # trigger unchanged
