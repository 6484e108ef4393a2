from __future__ import annotations

from typing import Any

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import AckTracker, EventBuilder
from services.pg2kafka.types import TypeRegistry
from shared.contract.event import JsonEventSerializer
from shared.errors import PermanentError

REL = pg.Relation(
    16384, "app", "Users", "d",
    (pg.Column("id", 23, -1, True), pg.Column("name", 25, -1, False),
     pg.Column("bio", 25, -1, False)),
)  # fmt: skip
NOKEY = pg.Relation(16385, "app", "log", "d", (pg.Column("line", 25, -1, False),))


def change(b: EventBuilder, msg: pg.Insert | pg.Update | pg.Delete, lsn: int) -> list[Any]:
    """The events as a consumer reads them (the builder embeds rows as pre-encoded JSON),
    checking on the way that the embedded JSON is what orjson writes for the same values:
    canonical, so a redelivery, and a key computed either way, are byte-identical."""
    out = []
    for ev in b.change(msg, lsn):
        encoded = orjson.dumps(ev)
        plain = orjson.loads(encoded)
        assert orjson.dumps(plain) == encoded
        out.append(plain)
    return out


def builder(no_identity: str = "emit") -> EventBuilder:
    b = EventBuilder("db1", TypeRegistry(), no_identity=no_identity)
    b.relation(REL)
    b.relation(NOKEY)
    b.begin(pg.Begin(500, 1_700_000_000_000_000, 77))
    return b


def test_insert_event_envelope_and_toast_marker() -> None:
    (ev,) = change(builder(), pg.Insert(16384, ("1", "ann", pg.UNCHANGED_TOAST)), 400)
    assert ev["v"] == 1
    assert ev["op"] == "insert"
    assert (ev["db"], ev["schema"], ev["table"]) == ("db1", "app", "Users")
    assert (ev["lsn"], ev["seq"], ev["commit_lsn"], ev["xid"]) == (400, 0, 500, 77)
    assert ev["commit_ts"] == "2023-11-14T22:13:20.000000Z"
    assert ev["key"] == {"id": 1}
    assert ev["new"] == {"id": 1, "name": "ann"}  # the unchanged TOAST value is not null
    assert "bio" not in ev["new"]
    assert ev["unchanged_toast"] == ["bio"]
    assert ev["types"] == {"id": "int4", "name": "text", "bio": "text"}
    # deterministic encoding: a redelivery is byte-identical
    ser = JsonEventSerializer()
    assert ser.encode(ev) == ser.encode(dict(ev))
    assert ser.decode(ser.encode(ev)) == ev


def test_seq_numbers_changes_within_a_transaction() -> None:
    b = builder()
    evs = [
        *change(b, pg.Insert(16384, ("1", "a", "x")), 400),
        *change(b, pg.Insert(16384, ("2", "b", "x")), 400),
    ]  # one multi-insert: same LSN
    assert [(e["lsn"], e["seq"]) for e in evs] == [(400, 0), (400, 1)]
    b.commit(pg.Commit(500, 510, 0))
    b.begin(pg.Begin(600, 0, 78))
    (nxt,) = change(b, pg.Insert(16384, ("3", "c", "x")), 550)
    assert nxt["seq"] == 0  # numbering restarts with each transaction


def test_update_that_changes_the_key_is_a_delete_then_an_insert() -> None:
    evs = change(builder(), pg.Update(16384, ("2", "ann", "x"), "K", ("1", None, None)), 401)
    assert [(e["op"], e["key"]) for e in evs] == [("delete", {"id": 1}), ("insert", {"id": 2})]
    assert evs[0]["old"] == {"id": 1}
    assert evs[0]["new"] is None
    assert evs[1]["new"] == {"id": 2, "name": "ann", "bio": "x"}
    assert evs[1]["old"] is None
    assert evs[0]["lsn"] == evs[1]["lsn"]
    assert (evs[0]["seq"], evs[1]["seq"]) == (0, 1)


def test_update_full_identity_and_delete() -> None:
    b = builder()
    (ev,) = change(b, pg.Update(16384, ("1", "b", "x"), "O", ("1", "a", "x")), 402)
    assert ev["op"] == "update"
    assert ev["old"] == {"id": 1, "name": "a", "bio": "x"}
    moved = change(b, pg.Update(16384, ("9", "b", "x"), "O", ("1", "b", "x")), 403)
    assert [e["op"] for e in moved] == ["delete", "insert"]  # FULL identity, key changed
    assert moved[0]["old"] == {"id": 1, "name": "b", "bio": "x"}
    (d,) = change(b, pg.Delete(16384, "K", ("1", None, None)), 404)
    assert d["op"] == "delete"
    assert d["old"] == {"id": 1}
    assert d["new"] is None


def test_no_identity_emit_or_skip(caplog: pytest.LogCaptureFixture) -> None:
    (ev,) = change(builder(), pg.Insert(16385, ("hello",)), 1)
    assert ev["key"] == {}
    b = builder("skip")
    assert change(b, pg.Insert(16385, ("hello",)), 1) == []
    assert change(b, pg.Insert(16385, ("again",)), 2) == []
    assert b.skipped_no_identity == 2
    warnings = [r for r in caplog.records if "no replica identity" in r.getMessage()]
    assert len(warnings) == 1  # once per table, not per row
    assert "app.log" in warnings[0].getMessage()


@pytest.mark.parametrize(
    "content",
    [
        b"1",
        b"not json",
        b'{"tables": [null]}',
        b'{"tables": "x"}',
        b'{"tables": [{"schema": "s", "table": "t"}]}',
        b'{"dropped": [{"schema": 1}]}',
    ],
)
def test_malformed_ddl_messages_are_skipped_and_counted(content: bytes) -> None:
    b = builder()
    assert b.ddl(pg.Message(True, 1, "walcast.ddl", content), 1) == []
    assert b.malformed_ddl == 1


def test_truncate_and_protocol_errors() -> None:
    b = builder()
    evs = b.truncate(pg.Truncate((16384, 16385), False, False), 9)
    assert [(e["op"], e["table"]) for e in evs] == [("truncate", "Users"), ("truncate", "log")]
    with pytest.raises(PermanentError, match="before its Relation"):
        change(b, pg.Insert(1, ("x",)), 1)
    b.commit(pg.Commit(500, 510, 0))
    with pytest.raises(PermanentError, match="outside a transaction"):
        change(b, pg.Insert(16384, ("1", "a", "b")), 1)


def test_ack_tracker_confirms_only_fully_acked_prefix() -> None:
    t = AckTracker()
    t.open(1)
    t.sent(1)
    t.sent(1)
    t.close(1, 100)
    t.open(2)
    t.sent(2)
    t.close(2, 200)
    t.acked(2)  # the later transaction is acknowledged first
    assert t.confirmed == 0
    t.acked(1)
    assert t.confirmed == 0  # one message of txn 1 still outstanding
    t.acked(1)
    assert t.confirmed == 200
    assert t.is_done(1)
    assert t.is_done(2)
    assert t.idle()


def test_ack_tracker_waits_for_commit_and_advances_when_idle() -> None:
    t = AckTracker()
    t.open(1)
    t.sent(1)
    t.acked(1)
    assert t.confirmed == 0  # acks alone do not confirm a transaction not yet committed
    t.advance_idle(999)
    assert t.confirmed == 0  # not idle: a transaction is open
    t.close(1, 150)
    assert t.confirmed == 150
    t.advance_idle(400)
    assert t.confirmed == 400
    t.open(2)
    t.close(2, 500)  # an empty (all filtered) transaction confirms at once
    assert t.confirmed == 500
    with pytest.raises(PermanentError):
        t.acked(42)


def test_a_value_that_does_not_convert_travels_as_text(caplog: pytest.LogCaptureFixture) -> None:
    rel = pg.Relation(
        16390,
        "app",
        "odd",
        "d",
        (pg.Column("id", 23, -1, True), pg.Column("tags", 1007, -1, False)),
    )
    b = builder()
    b.relation(rel)
    (ev,) = change(b, pg.Insert(16390, ("1", "{1,2")), 10)  # an unterminated array literal
    assert ev["new"] == {"id": 1, "tags": "{1,2"}
    assert b.unconverted == 1
    assert any("kept app.odd.tags as text" in r.getMessage() for r in caplog.records)
