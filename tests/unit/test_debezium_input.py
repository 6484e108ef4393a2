"""Debezium records read as walcast change events (``shared.formats.debezium_input``): the
real connector's captured records (``tests/unit/data``) come out as events the contract's
own decoder accepts, with the row as walcast carries it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from shared.contract.event import EventDecodeError, decode
from shared.formats import debezium
from shared.formats.debezium_input import events, is_debezium, translate

DATA = json.loads(
    (Path(__file__).parent / "data" / "debezium_3.7.0_types.json").read_text(encoding="utf-8")
)
RECORDS: list[list[Any]] = DATA["records"]  # insert, update, delete, tombstone


def raw(record: list[Any]) -> tuple[bytes | None, bytes | None]:
    key, value = record
    return (
        None if key is None else orjson.dumps(key),
        None if value is None else orjson.dumps(value),
    )


def test_the_connectors_records_become_events_the_contract_accepts() -> None:
    out = [translate(*raw(r)) for r in RECORDS]
    assert [len(o) for o in out] == [1, 1, 1, 0]  # the tombstone carries no change
    views = [decode(o[0]) for o in out[:3]]
    assert [v.op for v in views] == ["insert", "update", "delete"]
    src = [r[1]["payload"]["source"] for r in RECORDS[:3]]
    assert [v.lsn for v in views] == [s["lsn"] for s in src]
    assert all(v.key == {"id": 1} for v in views)
    ins = views[0].row()
    assert ins is not None
    after = RECORDS[0][1]["payload"]["after"]
    schema = {f["field"]: f for f in DATA["schema"]}
    assert ins == {name: debezium.to_walcast(schema[name], v) for name, v in after.items()}
    assert (ins["n"], ins["dt"]) == ("12345.67", "2024-02-29")  # exact, walcast's encoding
    assert views[0].column_types()["n"] == "numeric"
    assert views[2].row() is None
    ev = events(*raw(RECORDS[0]))[0]
    when = datetime.fromtimestamp(src[0]["ts_us"] / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert (ev["db"], ev["xid"], ev["commit_ts"]) == (src[0]["db"], src[0]["txId"], when)


def record(op: str, before: Any, after: Any, *, lsn: int = 100, key: Any = None,
           schema: bool = True) -> tuple[bytes | None, bytes]:  # fmt: skip
    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "string", "optional": True, "field": "body"},
        {"type": "bytes", "optional": True, "field": "blob"},
    ]
    payload = {
        "before": before,
        "after": after,
        "source": {"db": "d", "schema": "s", "table": "t", "lsn": lsn, "txId": 5,
                   "ts_us": 1_700_000_000_000_000, "snapshot": "false"},
        "op": op,
    }  # fmt: skip
    value: Any = payload
    if schema:
        row = {"type": "struct", "fields": fields, "optional": True}
        value = {
            "schema": {"type": "struct", "fields": [
                {**row, "field": "before"}, {**row, "field": "after"},
                {"type": "string", "optional": False, "field": "op"}]},
            "payload": payload,
        }  # fmt: skip
    k = None if key is None else orjson.dumps({"schema": {}, "payload": key})
    return k, orjson.dumps(value)


def test_a_snapshot_row_is_versioned_below_the_consistent_point() -> None:
    (ev,) = events(*record("r", None, {"id": 1, "body": "x", "blob": None}, key={"id": 1}))
    assert (ev["op"], ev["lsn"]) == ("read", 99)


def test_unchanged_toast_placeholders_are_listed_not_written() -> None:
    placeholder = debezium.UNAVAILABLE
    blob = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="  # its bytes, base64
    (ev,) = events(*record("u", None, {"id": 1, "body": placeholder, "blob": blob}, key={"id": 1}))
    assert ev["new"] == {"id": 1}
    assert ev["unchanged_toast"] == ["body", "blob"]
    decode(orjson.dumps(ev))


def test_a_keyless_rows_update_moves_it_to_its_new_key() -> None:
    """REPLICA IDENTITY FULL without a primary key: no Kafka key; walcast keys such a row
    by the whole row, so the update is a delete of the old row and an insert of the new."""
    old, new = {"id": 1, "body": "a", "blob": None}, {"id": 1, "body": "b", "blob": None}
    out = events(*record("u", old, new))
    assert [(e["op"], e["key"], e["seq"]) for e in out] == [("delete", old, 0), ("insert", new, 1)]
    (same,) = events(*record("u", old, old))
    assert (same["op"], same["key"]) == ("update", old)


def test_truncates_messages_and_tombstones() -> None:
    (t,) = events(*record("t", None, None))
    assert (t["op"], t["key"], t["table"]) == ("truncate", {}, "t")
    decode(orjson.dumps(t))
    assert events(*record("m", None, None)) == []
    assert events(b'{"id":1}', None) == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (record("c", None, {"id": 1}, schema=False)[1], "without its schema"),
        (b'{"payload": {"op": "c"}, "schema": null}', "without its schema"),
        (b"[1]", "not a JSON object"),
        (b"{", "not JSON"),
        (b'{"a": 1}', "not a Debezium change record"),
        (record("x", None, {"id": 1})[1], "unknown op 'x'"),
        (record("c", None, None)[1], "insert without an after image"),
        (record("d", None, None)[1], "delete without a before image"),
        (record("c", None, {"id": 1, "nope": 2})[1], "column 'nope' is not in its schema"),
        (record("c", None, {"id": 1}, lsn=-1)[1], "source.lsn"),
    ],
)
def test_records_it_cannot_read_say_why(data: bytes, reason: str) -> None:
    with pytest.raises(EventDecodeError, match=reason):
        translate(None, data)


def test_a_key_that_names_columns_the_row_lacks_is_refused() -> None:
    with pytest.raises(EventDecodeError, match=r"key column\(s\) \['other'\]"):
        translate(*record("c", None, {"id": 1}, key={"other": 1}))


def test_auto_tells_walcast_events_from_debezium_records() -> None:
    assert not is_debezium(b'{"v":1,"op":"insert"}')
    assert is_debezium(record("c", None, {"id": 1})[1])
    assert is_debezium(None)


def test_a_keyless_rows_unchanged_toast_comes_from_its_before_image() -> None:
    """The whole row is the key: an unchanged TOAST value in ``after`` is taken from the
    complete ``before`` (REPLICA IDENTITY FULL), so the key stays whole."""
    old = {"id": 1, "body": "long text", "blob": None}
    new = {"id": 2, "body": debezium.UNAVAILABLE, "blob": None}
    out = events(*record("u", old, new))
    assert [(e["op"], e["key"]) for e in out] == [
        ("delete", old), ("insert", {"id": 2, "body": "long text", "blob": None})]  # fmt: skip
    assert "unchanged_toast" not in out[1]


def test_unforeseen_shapes_are_unreadable_records_not_crashes() -> None:
    key, value = record("c", None, {"id": 1})
    broken = orjson.loads(value)
    broken["payload"]["source"]["ts_us"] = 2**62  # beyond any datetime
    with pytest.raises(EventDecodeError, match="unreadable Debezium record"):
        translate(key, orjson.dumps(broken))
