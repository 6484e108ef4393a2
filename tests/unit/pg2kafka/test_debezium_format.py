"""pg2kafka's Debezium records from pgoutput messages (pure logic; the comparison with the
real connector is tests/integration/pg2kafka/test_debezium_format.py)."""

from __future__ import annotations

from typing import Any

import orjson

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import Transaction
from services.pg2kafka.debezium_format import UNAVAILABLE, DebeziumRecords, SnapshotRead
from services.pg2kafka.settings import DebeziumSettings
from services.pg2kafka.types import TypeRegistry

REL = pg.Relation(
    16384,
    "app",
    "doc",
    "d",
    (
        pg.Column("id", 23, -1, True),
        pg.Column("title", 25, -1, False),
        pg.Column("body", 25, -1, False),
        pg.Column("tags", 1009, -1, False),
    ),
)
TXN = Transaction(xid=7, commit_lsn=100, commit_ts="", seq=1, commit_us=1_700_000_000_123_456)


def records(**settings: Any) -> DebeziumRecords:
    return DebeziumRecords(
        DebeziumSettings(**settings), "db", TypeRegistry(), lambda _oid: {"id", "title"},
        lambda oid: ["id"] if oid == REL.oid else [], clock=lambda: 42_000_000,
    )  # fmt: skip


def payload(value: bytes | None) -> Any:
    assert value is not None
    return orjson.loads(value)


def test_bare_payloads_without_schemas_and_no_tombstones() -> None:
    r = records(schemas=False, tombstones=False, topic_prefix="p")
    (ins,) = r.change(REL, pg.Insert(REL.oid, ("1", "t", "b", '{x,"y z"}')), TXN, 90)
    assert (ins.topic, ins.op, orjson.loads(ins.key or b"")) == ("p.app.doc", "insert", {"id": 1})
    value = payload(ins.value)
    assert value["after"] == {"id": 1, "title": "t", "body": "b", "tags": ["x", "y z"]}
    assert value["source"]["ts_us"] == TXN.commit_us
    assert value["source"]["lsn"] == 90
    assert value["ts_us"] == 42_000
    (dele,) = r.change(REL, pg.Delete(REL.oid, "K", ("1", None, None, None)), TXN, 95)
    # A required column outside the key holds its type's zero in a key-only image.
    assert payload(dele.value)["before"] == {"id": 1, "title": "", "body": None, "tags": None}


def test_unchanged_toast_is_the_connectors_placeholder() -> None:
    r = records()
    update = pg.Update(REL.oid, ("1", "t", pg.UNCHANGED_TOAST, pg.UNCHANGED_TOAST), None, None)
    (upd,) = r.change(REL, update, TXN, 90)
    after = payload(upd.value)["payload"]["after"]
    assert (after["body"], after["tags"]) == (UNAVAILABLE, [UNAVAILABLE])


def test_a_key_change_is_a_delete_its_tombstone_and_a_create() -> None:
    r = records()
    update = pg.Update(REL.oid, ("2", "t", "b", "{}"), "K", ("1", None, None, None))
    out = r.change(REL, update, TXN, 90)
    assert [(o.op, orjson.loads(o.key or b"")["payload"]) for o in out] == [
        ("delete", {"id": 1}),
        ("tombstone", {"id": 1}),
        ("insert", {"id": 2}),
    ]
    assert out[1].value is None


def test_full_identity_without_a_primary_key_has_no_key() -> None:
    """Under REPLICA IDENTITY FULL every column is flagged key; without a primary key the
    connector writes no key, and an update stays one update."""
    full = pg.Relation(16385, "app", "log", "f", tuple(
        pg.Column(c.name, c.type_oid, c.type_modifier, True) for c in REL.columns
    ))  # fmt: skip
    r = records()
    old = ("1", "t", "b", "{}")
    (upd,) = r.change(full, pg.Update(full.oid, ("1", "u", "b", "{}"), "O", old), TXN, 90)
    assert (upd.op, upd.key) == ("update", None)
    assert payload(upd.value)["payload"]["before"]["title"] == "t"
    out = r.change(full, pg.Delete(full.oid, "O", old), TXN, 91)
    assert [o.op for o in out] == ["delete"]  # no key: no tombstone


def test_unchanged_toast_in_an_integer_array_is_the_placeholders_bytes() -> None:
    rel = pg.Relation(16386, "app", "nums", "d", (
        pg.Column("id", 23, -1, True), pg.Column("xs", 1007, -1, False),
    ))  # fmt: skip
    (upd,) = records().change(
        rel, pg.Update(rel.oid, ("1", pg.UNCHANGED_TOAST), None, None), TXN, 90
    )
    assert payload(upd.value)["payload"]["after"]["xs"] == list(UNAVAILABLE.encode())


def test_a_snapshot_row_is_a_read_at_the_consistent_point() -> None:
    """As the connector's snapshot records: ``op r``, no before image, ``source.snapshot``
    true, the slot's consistent point as ``lsn`` (and in ``sequence``), the snapshot's
    start as ``ts_ms``; the row's text from COPY goes through the same encodings."""
    r = records(schemas=False, topic_prefix="p")
    r.last_commit_lsn = 77  # a streamed commit seen before does not leak into a read
    snap = SnapshotRead(lsn=500, started_us=1_700_000_000_000_001, xid=9)
    rec = r.read(REL, ("5", "t", None, "{a}"), snap)
    assert (rec.topic, rec.op, orjson.loads(rec.key or b"")) == ("p.app.doc", "read", {"id": 5})
    value = payload(rec.value)
    assert (value["op"], value["before"]) == ("r", None)
    assert value["after"] == {"id": 5, "title": "t", "body": None, "tags": ["a"]}
    source = value["source"]
    assert (source["snapshot"], source["lsn"], source["txId"]) == ("true", 500, 9)
    assert (source["sequence"], source["ts_ms"]) == ('[null,"500"]', 1_700_000_000_000)
