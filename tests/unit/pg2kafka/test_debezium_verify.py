"""What ``verify`` needs from pg2kafka's Debezium format (docs/events.md): each row's hash
in ``source.walcast_hash`` — the same number Postgres computes for the row's text
(shared/contract/rowhash.py), none where an unchanged TOAST value leaves the row's text
incomplete — and the verification marker as an ``m`` record, which the sinks' reader
turns back into walcast's ``verify`` event, in JSON and in Avro through a registry whose
subject already holds the table's envelope (the marker's schema is compatible with it
both ways)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import Transaction
from services.pg2kafka.debezium_format import DebeziumRecords, SnapshotRead
from services.pg2kafka.settings import DebeziumSettings
from services.pg2kafka.types import TypeRegistry
from shared.avro import ConnectRegistryEncoder, RegistryDecoder, registry_client
from shared.contract.event import EventDecodeError, decode
from shared.contract.rowhash import row_hash
from shared.formats.debezium_input import events
from shared.verify.marks import _is_mark
from tests.schema_registry import Registry, running

REL = pg.Relation(
    16390, "app", "acct", "d",
    (pg.Column("id", 20, -1, True), pg.Column("owner", 25, -1, False),
     pg.Column("note", 25, -1, False)),
)  # fmt: skip
NAMES = [c.name for c in REL.columns]
TXN = Transaction(xid=9, commit_lsn=300, commit_ts="", seq=1, commit_us=1_700_000_000_000_000)


def records(avro: ConnectRegistryEncoder | None = None, **settings: Any) -> DebeziumRecords:
    return DebeziumRecords(
        DebeziumSettings(**settings), "db", TypeRegistry(), lambda _oid: {"id"},
        lambda _oid: ["id"], clock=lambda: 5_000_000_000, avro=avro,
    )  # fmt: skip


def read_back(key: bytes | None, value: bytes | None) -> list[dict[str, Any]]:
    """As a sink reads a record: translated, then held to the event contract."""
    out = events(key, value)
    for ev in out:
        decode(orjson.dumps(ev))
    return out


def test_every_full_row_carries_the_hash_postgres_computes_for_it() -> None:
    r = records()
    row = ("7", "ann", None)
    (ins,) = r.change(REL, pg.Insert(REL.oid, row), TXN, 200)
    (ev,) = read_back(ins.key, ins.value)
    assert ev["hash"] == row_hash(zip(NAMES, row, strict=True))
    new = ("7", "bob", "x")
    (upd,) = r.change(REL, pg.Update(REL.oid, new, None, None), TXN, 210)
    (ev,) = read_back(upd.key, upd.value)
    assert ev["hash"] == row_hash(zip(NAMES, new, strict=True))
    assert ev["hash"] != row_hash(zip(NAMES, row, strict=True))
    snap = SnapshotRead(lsn=150, started_us=1, xid=3)
    ev = read_back(*(lambda rec: (rec.key, rec.value))(r.read(REL, row, snap)))[0]
    assert (ev["op"], ev["hash"]) == ("read", row_hash(zip(NAMES, row, strict=True)))


def test_a_key_change_creates_the_new_key_with_its_hash() -> None:
    r = records(tombstones=False)
    old, new = ("7", "ann", None), ("8", "ann", None)
    made = r.change(REL, pg.Update(REL.oid, new, "K", ("7", None, None)), TXN, 220)
    evs = [ev for rec in made for ev in read_back(rec.key, rec.value)]
    assert [(ev["op"], ev.get("hash")) for ev in evs] == [
        ("delete", None), ("insert", row_hash(zip(NAMES, new, strict=True)))]  # fmt: skip
    assert row_hash(zip(NAMES, old, strict=True)) != evs[1]["hash"]


def test_an_unchanged_toast_value_leaves_the_row_of_unknown_hash() -> None:
    r = records()
    update = pg.Update(REL.oid, ("7", "ann", pg.UNCHANGED_TOAST), None, None)
    (upd,) = r.change(REL, update, TXN, 230)
    assert orjson.loads(upd.value or b"")["payload"]["source"]["walcast_hash"] is None
    (ev,) = read_back(upd.key, upd.value)
    assert "hash" not in ev
    assert ev["unchanged_toast"] == ["note"]


def test_the_connectors_records_without_a_hash_are_of_unknown_hash() -> None:
    r = records()
    (ins,) = r.change(REL, pg.Insert(REL.oid, ("7", "ann", None)), TXN, 200)
    value = orjson.loads(ins.value or b"")
    del value["payload"]["source"]["walcast_hash"]
    (ev,) = read_back(ins.key, orjson.dumps(value))
    assert "hash" not in ev


@pytest.mark.parametrize("bad", [-1, 2**32, "12", 1.5, True])
def test_a_hash_out_of_range_is_an_unreadable_record(bad: Any) -> None:
    r = records()
    (ins,) = r.change(REL, pg.Insert(REL.oid, ("7", "ann", None)), TXN, 200)
    value = orjson.loads(ins.value or b"")
    value["payload"]["source"]["walcast_hash"] = bad
    with pytest.raises(EventDecodeError, match="walcast_hash"):
        events(ins.key, orjson.dumps(value))


@pytest.mark.parametrize("schemas", [True, False])
def test_a_marker_record_reads_back_as_the_verify_event(schemas: bool) -> None:
    r = records(schemas=schemas)
    rec = r.mark("app", "acct", "v-1", TXN, 240)
    assert (rec.topic, rec.key, rec.op) == ("walcast.app.acct", None, "verify")
    value = orjson.loads(rec.value or b"")
    payload = value["payload"] if schemas else value
    assert (payload["op"], payload["source"]["walcast_mark"]) == ("m", "v-1")
    if not schemas:
        # the sinks cannot read schemaless records, and verify finds no marker in them
        assert not _is_mark(rec.value or b"", "v-1", ("app", "acct"))
        return
    (ev,) = read_back(None, rec.value)
    assert (ev["op"], ev["verify"], ev["schema"], ev["table"], ev["lsn"]) == (
        "verify", {"id": "v-1"}, "app", "acct", 240)  # fmt: skip
    # where verify looks for it: this marker, of this table only
    assert _is_mark(rec.value or b"", "v-1", ("app", "acct"))
    assert not _is_mark(rec.value or b"", "v-2", ("app", "acct"))
    assert not _is_mark(rec.value or b"", "v-1", ("app", "other"))


def test_other_logical_messages_still_carry_nothing() -> None:
    r = records()
    value = orjson.loads(r.mark("app", "acct", "v-1", TXN, 240).value or b"")
    value["payload"]["source"]["walcast_mark"] = None
    assert read_back(None, orjson.dumps(value)) == []


@pytest.fixture
def registry() -> Iterator[tuple[Any, Registry]]:
    with running() as (url, state):
        yield registry_client(url), state


@pytest.mark.parametrize("level", ["BACKWARD", "FULL_TRANSITIVE"])
def test_in_avro_the_marker_shares_the_tables_subject(
    registry: tuple[Any, Registry], level: str
) -> None:
    """Rows, a marker, rows again under the ``topic`` strategy: the registry takes the
    marker's schema beside the envelope's at the strictest level, and both read back."""
    client, state = registry
    state.level = level
    r = records(avro=ConnectRegistryEncoder(client))
    dec = RegistryDecoder(client)
    (ins,) = r.change(REL, pg.Insert(REL.oid, ("7", "ann", None)), TXN, 200)
    mark = r.mark("app", "acct", "v-2", TXN, 240)
    (ins2,) = r.change(REL, pg.Insert(REL.oid, ("8", "bob", "n")), TXN, 250)
    assert sorted(state.subjects) == ["walcast.app.acct-key", "walcast.app.acct-value"]
    assert len(state.subjects["walcast.app.acct-value"]) == 2  # the envelope, the marker's
    (m,) = read_back(None, dec.decode(mark.value or b""))
    assert (m["op"], m["verify"]) == ("verify", {"id": "v-2"})
    for rec, row in ((ins, ("7", "ann", None)), (ins2, ("8", "bob", "n"))):
        (ev,) = read_back(dec.decode(rec.key or b""), dec.decode(rec.value or b""))
        assert ev["hash"] == row_hash(zip(NAMES, row, strict=True))


RANGE_END = {"id": 4, "phase": "range_end", "rows": 2,
             "key_ranges": {"columns": ["id"], "ranges": [[[3], [9]]]}}  # fmt: skip


def test_an_incremental_snapshot_reads_back_as_walcasts_rows_and_end_marker() -> None:
    """``repair`` of a sink fed this format: the snapshot's rows as ``r`` records of an
    incremental snapshot, versioned one below their ``source.lsn``, and its end as an
    ``m`` record whose ``source.walcast_snapshot`` becomes walcast's end marker (the event
    contract checks its block)."""
    r = records()
    row = ("7", "ann", None)
    snap = SnapshotRead(lsn=501, started_us=1, xid=0, kind="incremental")
    rec = r.read(REL, row, snap)
    assert orjson.loads(rec.value or b"")["payload"]["source"]["snapshot"] == "incremental"
    (ev,) = read_back(rec.key, rec.value)
    assert (ev["op"], ev["lsn"], ev["xid"], ev["key"]) == ("read", 500, 0, {"id": 7})
    end = r.snapshot_end("app", "acct", RANGE_END, 500)
    assert (end.topic, end.key, end.op) == ("walcast.app.acct", None, "snapshot")
    (m,) = read_back(None, end.value)
    assert (m["op"], m["lsn"], m["snapshot"]) == ("snapshot", 500, RANGE_END)
    assert not _is_mark(end.value or b"", "4", ("app", "acct"))  # not a verification's


def test_a_malformed_snapshot_end_is_an_unreadable_record() -> None:
    value = orjson.loads(records().snapshot_end("app", "acct", RANGE_END, 500).value or b"")
    value["payload"]["source"]["walcast_snapshot"] = '["not", "an object"]'
    with pytest.raises(EventDecodeError, match="walcast_snapshot"):
        events(None, orjson.dumps(value))
    value["payload"]["source"]["walcast_snapshot"] = '{"id": 4, "phase": "sideways"}'
    with pytest.raises(EventDecodeError, match="phase"):
        read_back(None, orjson.dumps(value))


def test_in_avro_the_snapshot_end_shares_the_tables_subject(
    registry: tuple[Any, Registry],
) -> None:
    client, state = registry
    state.level = "FULL_TRANSITIVE"
    r = records(avro=ConnectRegistryEncoder(client))
    dec = RegistryDecoder(client)
    (ins,) = r.change(REL, pg.Insert(REL.oid, ("7", "ann", None)), TXN, 200)
    end = r.snapshot_end("app", "acct", RANGE_END, 500)
    (m,) = read_back(None, dec.decode(end.value or b""))
    assert (m["op"], m["snapshot"]) == ("snapshot", RANGE_END)
    (ev,) = read_back(dec.decode(ins.key or b""), dec.decode(ins.value or b""))
    assert ev["op"] == "insert"
