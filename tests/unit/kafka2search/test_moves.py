"""Rows older than a rename or drop the index applied: the move applied on the way in."""

from __future__ import annotations

from typing import Any

import orjson

from services.kafka2search.moves import moves_of, record, translate
from shared.contract.event import EventView, decode


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
    moves = moves_of(orjson.loads(orjson.dumps(meta)))  # as read back from _meta
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
    moves = [("note", "remark", 100)]
    ev = _row(150, {"id": 1, "note": "a column added again"}, {"id": "int4", "note": "text"})
    assert translate(ev, moves) is ev


def test_an_unchanged_toast_column_is_renamed_too() -> None:
    moves = [("big", "body", 100)]
    ev = _row(50, {"id": 1}, {"id": "int4", "big": "text"}, toast=["big"])
    out = translate(ev, moves)
    assert out.unchanged_toast == ["body"]
    assert dict(out.column_types()) == {"id": "int4", "body": "text"}
