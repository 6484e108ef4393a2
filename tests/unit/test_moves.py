"""Rows older than a rename or drop the index applied: the move applied on the way in."""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from shared.contract.event import EventView, decode
from shared.contract.moves import Moves, record, translate


def _row(lsn: int, new: dict[str, Any] | None, types: dict[str, str], op: str = "update",
         toast: list[str] | None = None) -> EventView:  # fmt: skip
    ev: dict[str, Any] = {"v": 1, "op": op, "db": "app", "schema": "public", "table": "t",
                          "lsn": lsn, "key": {"id": 1}, "new": new, "types": types}  # fmt: skip
    if toast:
        ev["unchanged_toast"] = toast
    return decode(orjson.dumps(ev))


def test_renames_and_drops_newer_than_the_row_apply_in_order() -> None:
    meta: dict[str, Any] = {}
    record(meta, [("note", "remark")], [], 100)
    record(meta, [("remark", "text")], ["gone"], 200)
    moves = Moves.of(orjson.loads(orjson.dumps(meta)))  # as read back from _meta
    ev = _row(50, {"id": 1, "note": "n", "gone": 1},
              {"id": "int4", "note": "text", "gone": "int4"})  # fmt: skip
    out = translate(ev, moves)
    assert orjson.loads(bytes(out.new)) == {"id": 1, "text": "n"}
    assert dict(out.column_types()) == {"id": "int4", "text": "text"}
    between = translate(
        _row(150, {"id": 1, "remark": "r"}, {"id": "int4", "remark": "text"}), moves
    )
    assert orjson.loads(bytes(between.new)) == {"id": 1, "text": "r"}


def test_a_row_newer_than_every_move_is_left_as_it_is() -> None:
    moves = Moves.of({"moves": [["note", "remark", 100]]})
    ev = _row(150, {"id": 1, "note": "a column added again"}, {"id": "int4", "note": "text"})
    assert translate(ev, moves) is ev


def test_an_unchanged_toast_column_is_renamed_too() -> None:
    moves = Moves.of({"moves": [["big", "body", 100]]})
    ev = _row(50, {"id": 1}, {"id": "int4", "big": "text"}, toast=["big"])
    out = translate(ev, moves)
    assert out.unchanged_toast == ["body"]
    assert dict(out.column_types()) == {"id": "int4", "body": "text"}


def test_a_row_with_both_names_was_written_after_the_rename() -> None:
    # a snapshot's read row: its version (restart position - 1) is below the rename it
    # saw, and "note" is a column added again since
    moves = Moves.of({"moves": [["note", "remark", 100]]})
    ev = _row(50, {"id": 1, "note": "new", "remark": "renamed"},
              {"id": "int4", "note": "text", "remark": "text"}, op="read")  # fmt: skip
    assert translate(ev, moves) is ev


def test_a_read_row_keeps_a_column_dropped_and_added_again() -> None:
    moves = Moves.of({"moves": [["note", None, 100]]})
    ev = _row(50, {"id": 1, "note": "the new column's"}, {"id": "int4", "note": "text"}, "read")
    assert translate(ev, moves, held={"id", "note"}) is ev
    # not added again: the read was older than the drop
    out = translate(ev, moves, held={"id"})
    assert orjson.loads(bytes(out.new)) == {"id": 1}
    # any other row older than the drop had the old column, whatever the index holds now
    change = _row(50, {"id": 1, "note": "old"}, {"id": "int4", "note": "text"})
    assert orjson.loads(bytes(translate(change, moves, held={"id", "note"}).new)) == {"id": 1}


def test_values_are_moved_as_written() -> None:
    # integers beyond 64 bits and deep values are never decoded (orjson reads the first as
    # floats, and stops at 255 levels)
    moves = Moves.of({"moves": [["n", "m", 100]]})
    deep = "[" * 400 + "]" * 400
    new = b'{"id":1,"n":123456789012345678901234567890,"d":%b}' % deep.encode()
    ev = decode(
        b'{"v":1,"op":"update","db":"app","schema":"public","table":"t","lsn":50,'
        b'"key":{"id":1},"new":%b,"types":{"id":"int4","n":"numeric","d":"jsonb"}}' % new
    )
    out = translate(ev, moves)
    assert bytes(out.new) == b'{"id":1,"d":%b,"m":123456789012345678901234567890}' % deep.encode()


def test_a_row_that_is_no_json_object_is_handed_on_for_the_batch_to_report() -> None:
    # the event decoder refuses such rows; a view built otherwise must not fail here
    moves = Moves.of({"moves": [["n", "m", 100]]})
    ev = _row(50, {"id": 1, "n": 1}, {"id": "int4", "n": "int4"})
    for new in (b"[1,2]", b'{"id":1,"n":', b"{" + b'"n":[' * 3000):
        bad = msgspec.structs.replace(ev, new=msgspec.Raw(new))
        assert translate(bad, moves) is bad
    bad = msgspec.structs.replace(ev, unchanged_toast=[1])
    assert translate(bad, moves) is bad


def test_a_deletes_column_types_get_the_moves_too() -> None:
    # its types would otherwise map a dropped column again
    moves = Moves.of({"moves": [["dropme", None, 100], ["note", "remark", 100]]})
    ev = _row(50, None, {"id": "int4", "note": "text", "dropme": "text"}, op="delete")
    out = translate(ev, moves)
    assert dict(out.column_types()) == {"id": "int4", "remark": "text"}
    assert out.new is ev.new
