"""Rows of insert-only tables (``append_only``) in kafka2search: their document id is the
contract's row id under a prefix no key's text keeps, the same on every redelivery and
different for every row; a malformed one is refused with a reason, never given a made-up
id."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from services.kafka2search.documents import Batch
from services.kafka2search.mapping import APPEND_ONLY, document_id
from shared.contract.event import append_only_id, decode
from tests.unit.kafka2search.test_documents import event, origin

INDEX = "walcast-public.history"


def appended(lsn: int, seq: int, op: str = "insert", **fields: Any) -> dict[str, Any]:
    """An insert (or read row) of an insert-only table: no key, ``append_only``, a row."""
    return event(
        op, lsn=lsn, commit_lsn=lsn + 8, seq=seq, key={}, append_only=True,
        new={"tid": 1, "delta": 5}, types={"tid": "int4", "delta": "int4"}, **fields,
    )  # fmt: skip


def add(batch: Batch, ev: dict[str, Any]) -> str | None:
    raw = orjson.dumps(ev)
    return batch.add(INDEX, decode(raw), origin(raw))


def test_append_only_rows_are_indexed_under_their_row_id() -> None:
    batch = Batch()
    # Two identical rows of one transaction (one COPY): the same LSN, different seq.
    assert add(batch, appended(500, 0)) is None
    assert add(batch, appended(500, 1)) is None
    ids = sorted(d.id for d in batch.docs.values())
    assert ids == [APPEND_ONLY + append_only_id(0, 508, s, None) for s in (0, 1)]
    assert all(d.lsn == 500 and not d.delete for d in batch.docs.values())


def test_a_redelivered_append_only_row_keeps_its_id() -> None:
    batch = Batch()
    add(batch, appended(500, 3))
    add(batch, appended(500, 3))  # the same record again (a redelivery)
    assert len(batch.docs) == 1


def test_snapshot_rows_and_epochs_get_ids_of_their_own() -> None:
    batch = Batch()
    snap = {"id": 7, "chunk": 2}
    add(batch, appended(500, 0, op="read", snapshot=snap))
    add(batch, appended(500, 0, epoch=1))
    add(batch, appended(500, 0))
    assert sorted(d.id for d in batch.docs.values()) == sorted(
        APPEND_ONLY + i
        for i in (
            append_only_id(0, 508, 0, {"id": 7, "chunk": 2}),
            append_only_id(1, 508, 0, None),
            append_only_id(0, 508, 0, None),
        )
    )


def test_an_append_only_row_without_its_position_is_refused() -> None:
    batch = Batch()
    for broken in (
        {"seq": "0"},
        {"commit_lsn": None},
        {"op": "read", "snapshot": {"id": 1}},
    ):
        reason = add(batch, appended(500, 0) | broken)
        assert reason is not None, broken
        assert "append_only" in reason, (broken, reason)
    assert not batch.docs


def test_append_only_false_is_an_ordinary_keyless_row() -> None:
    batch = Batch()
    reason = add(batch, appended(500, 0) | {"append_only": False})
    assert reason == "the table has no primary key or replica identity: no document id"


def test_no_key_can_take_an_append_only_rows_id() -> None:
    row = append_only_id(0, 1, 5, None)  # "1.5"
    assert document_id({"price": 1.5}) == row  # what a bare row id would collide with
    assert document_id({}, row) == APPEND_ONLY + row
    assert document_id({"price": 1.5}) != document_id({}, row)
    # A key whose text is an append-only id is hashed, as one starting with sha256:.
    text = APPEND_ONLY + row
    assert document_id({"code": text}) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()
