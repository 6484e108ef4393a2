"""A document's stamp (services/kafka2search/stamps.py): written with every document, true
to the bytes that follow it, and broken by any other writer, which has the engine
serialise the source anew."""

from __future__ import annotations

import zlib

import orjson
import pytest

from services.kafka2search.stamps import body_intact, mget_documents, restamped, stamped

STAMP = b'{"_walcast_hash":7,"_walcast_xid":42,"_walcast_body":%d'


def written(row: bytes, row_hash: int | None = 7, xid: int = 42) -> bytes:
    return b"".join(bytes(p) for p in stamped(row, row_hash, xid))


@pytest.mark.parametrize(
    ("row", "want"),
    [
        (
            b'{"id":1,"a":1.50}',
            b'{"_walcast_hash":7,"_walcast_xid":42,"_walcast_body":%d,"id":1,"a":1.50}',
        ),
        (b"{}", b'{"_walcast_hash":7,"_walcast_xid":42,"_walcast_body":%d}'),
        (b' { "id" : 1 } ', b'{"_walcast_hash":7,"_walcast_xid":42,"_walcast_body":%d,"id" : 1 }'),
        (b"{ }", b'{"_walcast_hash":7,"_walcast_xid":42,"_walcast_body":%d}'),
    ],
)
def test_the_stamp_is_the_crc_of_what_follows_it(row: bytes, want: bytes) -> None:
    out = written(row)
    after = want.split(b"%d", 1)[1]
    assert out == want % zlib.crc32(after)
    assert orjson.loads(out)["_walcast_body"] == zlib.crc32(after)
    assert body_intact(out) is True


def test_without_a_known_hash_the_stamp_has_no_hash_field() -> None:
    out = written(b'{"id":1}', row_hash=None)
    assert out.startswith(b'{"_walcast_xid":42,"_walcast_body":')
    assert body_intact(out) is True


def test_a_value_changed_after_the_stamp_is_seen() -> None:
    out = written(b'{"id":1,"name":"a"}')
    assert body_intact(out.replace(b'"a"', b'"b"')) is False


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(name="b"),  # an _update: the source merged and written anew
        lambda d: d.update(extra=1),  # a field added
        lambda d: d.pop("name"),  # a field removed
        lambda d: None,  # the same values indexed again by another writer
    ],
)
def test_another_writer_serialising_the_source_breaks_the_stamp(edit: object) -> None:
    out = written(b'{"id":1,  "name":"a","n":1.50}')
    doc = orjson.loads(out)
    edit(doc)  # type: ignore[operator]
    assert body_intact(orjson.dumps(doc)) is False


def test_a_stamp_removed_with_the_fields_left_is_not_known() -> None:
    """A document indexed whole by another writer without walcast's fields carries no
    stamp: like one written before documents had stamps, it is not judged by its stamp
    (its missing hash makes it a row of unknown hash)."""
    assert body_intact(b'{"id":1,"name":"b"}') is None


def test_a_stamp_moved_from_its_place_is_broken() -> None:
    out = orjson.loads(written(b'{"id":1}'))
    moved = {"id": 1, **{k: v for k, v in out.items() if k != "id"}}
    assert body_intact(orjson.dumps(moved)) is False


def test_walcast_rewriting_a_document_stamps_it_anew() -> None:
    """A column renamed or dropped: walcast reads the document and writes it back."""
    doc = orjson.loads(written(b'{"id":1,"old":"x"}'))
    doc["new"] = doc.pop("old")
    out = restamped(doc)
    assert body_intact(out) is True
    assert orjson.loads(out) == {
        "_walcast_hash": 7, "_walcast_xid": 42, "_walcast_body": orjson.loads(out)["_walcast_body"],
        "id": 1, "new": "x",
    }  # fmt: skip


def test_a_document_without_verify_fields_is_rewritten_without_a_stamp() -> None:
    assert restamped({"id": 1}) == b'{"id":1}'


def test_a_document_another_writer_changed_keeps_its_broken_stamp_when_rewritten() -> None:
    """A column renamed after another writer edited the document: walcast's rewrite
    must not make the edit look like its own."""
    doc = orjson.loads(written(b'{"id":1,"old":"x"}'))
    doc["id"] = 2  # the edit (the source as the engine now holds it)
    doc["new"] = doc.pop("old")
    assert body_intact(restamped(dict(doc), intact=False)) is False
    assert body_intact(restamped(dict(doc), intact=True)) is True


def test_negative_numbers_in_walcasts_fields_still_parse() -> None:
    out = b"".join(bytes(p) for p in stamped(b'{"id":1}', -5, -1))
    assert body_intact(out) is True


def test_an_mget_answer_gives_each_found_document_with_its_stamp_checked() -> None:
    kept = written(b'{"id":1,"v":"a"}')
    changed = orjson.dumps({**orjson.loads(written(b'{"id":2,"v":"b"}')), "v": "x"})
    raw = (
        b'{"docs":[{"_index":"i","_id":"1","_version":7,"found":true,"_source":%b},'
        b'{"_index":"i","_id":"2","_version":8,"found":true,"_source":%b},'
        b'{"_index":"i","_id":"3","found":false},'
        b'{"_index":"i","_id":"4","_version":2,"found":true,"_source":{"id":4}}]}'
    ) % (kept, changed)
    got = {d[0]: (d[1], d[2].get("v"), d[3]) for d in mget_documents(raw)}
    assert got == {"1": (7, "a", True), "2": (8, "x", False), "4": (2, None, None)}
