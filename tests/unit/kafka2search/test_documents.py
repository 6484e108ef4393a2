"""kafka2search documents: event validation, per-batch reduction and bulk bodies."""

from __future__ import annotations

import zlib
from typing import Any

import msgspec
import orjson
import pytest

from services.kafka2search.documents import Batch, Doc, Origin, bulk_body
from services.kafka2search.mapping import ROW_BODY
from services.kafka2search.stamps import body_intact
from shared.contract import event as contract_event
from shared.contract.event import ROW_HASH, ROW_XID, EventDecodeError, EventView, decode

INDEX = "walcast-public.users"


def event(op: str = "insert", **fields: Any) -> dict[str, Any]:
    """A valid change event of op ``op``; ``fields`` replace or add top-level fields."""
    ev: dict[str, Any] = {
        "v": 1,
        "op": op,
        "db": "app",
        "schema": "public",
        "table": "users",
        "lsn": 100,
        "seq": 0,
        "commit_lsn": 120,
        "xid": 7,
        "commit_ts": "2024-01-01T00:00:00.000000Z",
    }
    if op in ("insert", "update", "delete"):
        ev["key"] = {"id": 1}
        ev["types"] = {"id": "int4", "name": "text", "bio": "text"}
    if op in ("insert", "update"):
        ev["new"] = {"id": 1, "name": "ann", "bio": "long text"}
    if op == "ddl":
        ev["ddl"] = {"tag": "ALTER TABLE", "statement": "ALTER TABLE users ADD c int"}
    ev.update(fields)
    return ev


def raw(ev: dict[str, Any]) -> bytes:
    return orjson.dumps(ev)


def without(ev: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in ev.items() if k != name}


_offsets = iter(range(1_000_000))


def origin(value: bytes = b"{}") -> Origin:
    return Origin("walcast.cdc", 0, next(_offsets), b"k", value)


def read_back(ev: EventView) -> dict[str, Any]:
    """What parse kept, as a dict: the fields the service reads (None: absent), with the
    raw ``new`` and ``types`` decoded."""
    out: dict[str, Any] = {}
    for name in ev.__struct_fields__:
        value = getattr(ev, name)
        if name in ("new", "types"):
            value = orjson.loads(bytes(value)) if value else None
        if value is not None:
            out[name] = value
    return out


def kept(ev: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``ev`` that parse keeps."""
    return {k: v for k, v in ev.items() if k in EventView.__struct_fields__ and v is not None}


def source(doc: Doc) -> dict[str, Any] | None:
    """A document's source, decoded if it is still the event's raw JSON."""
    if isinstance(doc.source, msgspec.Raw):
        decoded: dict[str, Any] = orjson.loads(bytes(doc.source))
        return decoded
    return doc.source


# -- parse ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(None, "empty record", id="none-value"),
        pytest.param(b"", "not JSON", id="empty-bytes"),
        pytest.param(b"{not json", "not JSON", id="not-json"),
        pytest.param(b"[1, 2]", "not a JSON object", id="array"),
        pytest.param(b'"insert"', "not a JSON object", id="string"),
        pytest.param(b"null", "not a JSON object", id="null"),
        pytest.param(raw(without(event(), "v")), "unknown event version None", id="no-v"),
        pytest.param(raw(event(v=2)), "unknown event version 2", id="v2"),
        pytest.param(raw(event(v="1")), "unknown event version '1'", id="v-as-string"),
        pytest.param(raw(event(op="upsert")), "unknown op 'upsert'", id="unknown-op"),
        pytest.param(raw(without(event(), "op")), "unknown op None", id="no-op"),
        pytest.param(raw(without(event(), "db")), "'db' missing", id="no-db"),
        pytest.param(raw(without(event(), "schema")), "'schema' missing", id="no-schema"),
        pytest.param(raw(without(event(), "table")), "'table' missing", id="no-table"),
        pytest.param(raw(event(table=5)), "'table' missing or not a string", id="table-int"),
        pytest.param(raw(without(event(), "lsn")), "'lsn'", id="no-lsn"),
        pytest.param(raw(event(lsn="100")), "'lsn'", id="lsn-string"),
        pytest.param(raw(event(lsn=1.5)), "'lsn'", id="lsn-float"),
        pytest.param(raw(event(lsn=True)), "'lsn'", id="lsn-bool"),
        pytest.param(raw(event(lsn=-1)), "'lsn'", id="lsn-negative"),
        pytest.param(raw(event(lsn=None)), "'lsn'", id="lsn-null"),
        pytest.param(raw(without(event(), "key")), "'key' missing", id="insert-no-key"),
        pytest.param(raw(without(event("delete"), "key")), "'key' missing", id="delete-no-key"),
        pytest.param(raw(event(key=[1])), "'key' missing or not an object", id="key-list"),
        pytest.param(raw(without(event("insert"), "new")), "insert without a 'new'", id="ins"),
        pytest.param(raw(without(event("update"), "new")), "update without a 'new'", id="upd"),
        pytest.param(raw(event("update", new=None)), "update without a 'new'", id="new-null"),
        pytest.param(raw(event("insert", new=[1])), "insert without a 'new'", id="new-list"),
        pytest.param(raw(event(types=["int4"])), "'types' is not an object", id="types-list"),
        pytest.param(raw(event(types=None)), "'types' is not an object", id="types-null"),
        pytest.param(
            raw(event("update", unchanged_toast="bio")), "'unchanged_toast'", id="toast-str"
        ),
        pytest.param(
            raw(event("update", unchanged_toast={"bio": 1})), "'unchanged_toast'", id="toast-obj"
        ),
        pytest.param(
            raw(event("update", unchanged_toast=["bio", 3])), "'unchanged_toast'", id="toast-int"
        ),
        pytest.param(
            raw(event("update", unchanged_toast=[None])), "'unchanged_toast'", id="toast-null"
        ),
        pytest.param(raw(without(event("ddl"), "ddl")), "without a 'ddl' object", id="no-ddl"),
        pytest.param(raw(event("ddl", ddl="ALTER")), "without a 'ddl' object", id="ddl-str"),
        pytest.param(raw(without(event("truncate"), "lsn")), "'lsn'", id="truncate-no-lsn"),
        pytest.param(raw(without(event("truncate"), "table")), "'table'", id="truncate-no-table"),
    ],
)
def test_parse_rejects_poison_with_the_reason(value: bytes | None, reason: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode(value)
    assert reason in str(info.value)


def test_parse_rejects_types_with_non_string_values() -> None:
    with pytest.raises(EventDecodeError, match="'types'"):
        decode(raw(event(types={"id": 23})))


@pytest.mark.parametrize("value", [False, "", {}, 0], ids=["false", "empty-str", "obj", "zero"])
def test_parse_rejects_falsy_unchanged_toast_that_is_not_a_list(value: object) -> None:
    with pytest.raises(EventDecodeError, match="'unchanged_toast'"):
        decode(raw(event("update", unchanged_toast=value)))


@pytest.mark.parametrize(
    "columns",
    [[{"name": "c"}], [{"name": "c", "type": 23}], ["c"], {"c": "int4"}],
    ids=["no-type", "type-not-str", "not-objects", "not-a-list"],
)
def test_parse_rejects_ddl_columns_that_are_not_name_type_objects(columns: object) -> None:
    ddl = {"tag": "ALTER TABLE", "statement": "ALTER TABLE users ADD c int", "columns": columns}
    with pytest.raises(EventDecodeError, match="ddl 'columns'"):
        decode(raw(event("ddl", ddl=ddl)))


def test_parse_accepts_ddl_with_its_resulting_columns() -> None:
    columns = [{"name": "id", "type": "int4"}, {"name": "c", "type": "int4"}]
    ddl = {"tag": "ALTER TABLE", "statement": "ALTER TABLE users ADD c int", "columns": columns}
    assert decode(raw(event("ddl", ddl=ddl))).ddl["columns"] == columns


def test_poison_is_a_value_error_so_generic_decode_handlers_catch_it() -> None:
    assert issubclass(EventDecodeError, ValueError)


@pytest.mark.parametrize("op", ["heartbeat", "message"])
def test_ops_the_producer_never_emits_are_poison(op: str) -> None:
    """Once declared everywhere and never emitted (issue 15): now not part of the contract."""
    with pytest.raises(EventDecodeError, match="unknown op"):
        decode(b'{"v":1,"op":"%b","db":"d","schema":"s","table":"t","lsn":1}' % op.encode())


@pytest.mark.parametrize("op", ["insert", "update", "delete", "truncate", "ddl"])
def test_valid_events_parse_to_the_same_object(op: str) -> None:
    ev = event(op)
    assert read_back(decode(raw(ev))) == kept(ev)


def test_valid_update_with_unchanged_toast_and_lsn_zero_passes() -> None:
    ev = event("update", lsn=0, unchanged_toast=["bio"], new={"id": 1, "name": "ann"})
    assert decode(raw(ev)).unchanged_toast == ["bio"]


def test_delete_needs_no_new_row_and_types_are_optional() -> None:
    ev = without(without(event("delete"), "types"), "new")
    parsed = decode(raw(ev))
    assert read_back(parsed) == kept(ev)
    assert parsed.column_types() == {}


def test_control_events_need_no_key() -> None:
    ev = event("truncate")
    assert "key" not in ev
    assert decode(raw(ev)).op == "truncate"


# -- Batch.add --------------------------------------------------------------------------


def add(batch: Batch, ev: dict[str, Any], index: str = INDEX) -> str | None:
    value = raw(ev)
    return batch.add(index, decode(value), origin(value))


def test_newest_change_per_document_wins() -> None:
    b = Batch()
    add(b, event("insert", lsn=10, new={"id": 1, "name": "a"}))
    add(b, event("update", lsn=20, new={"id": 1, "name": "b"}))
    add(b, event("insert", lsn=15, key={"id": 2}, new={"id": 2, "name": "x"}))
    assert set(b.docs) == {(INDEX, "1"), (INDEX, "2")}
    doc = b.docs[(INDEX, "1")]
    assert (doc.lsn, doc.delete, source(doc)) == (20, False, {"id": 1, "name": "b"})
    assert b.records == 3
    assert len(b) == 3


def test_same_id_in_two_indices_are_two_documents() -> None:
    b = Batch()
    add(b, event("insert", lsn=10), index="a")
    add(b, event("insert", lsn=11), index="b")
    assert set(b.docs) == {("a", "1"), ("b", "1")}


def test_older_lsn_arriving_later_is_ignored_but_counted() -> None:
    b = Batch()
    add(b, event("update", lsn=20, new={"id": 1, "name": "new"}))
    reason = add(b, event("update", lsn=10, new={"id": 1, "name": "old"}))
    assert reason is None
    doc = b.docs[(INDEX, "1")]
    assert (doc.lsn, source(doc)) == (20, {"id": 1, "name": "new"})
    assert b.records == 2  # its offset is still covered by the batch


def test_older_delete_does_not_remove_a_newer_insert() -> None:
    b = Batch()
    add(b, event("insert", lsn=20, new={"id": 1, "name": "new"}))
    add(b, event("delete", lsn=10))
    assert b.docs[(INDEX, "1")].delete is False


def test_same_lsn_later_change_wins() -> None:
    b = Batch()
    add(b, event("update", lsn=20, new={"id": 1, "name": "first"}))
    add(b, event("update", lsn=20, new={"id": 1, "name": "second"}))
    assert source(b.docs[(INDEX, "1")]) == {"id": 1, "name": "second"}


def test_delete_then_reinsert_keeps_the_insert() -> None:
    b = Batch()
    add(b, event("insert", lsn=10, new={"id": 1, "name": "a"}))
    add(b, event("delete", lsn=20))
    deleted = b.docs[(INDEX, "1")]
    assert (deleted.delete, deleted.source, deleted.missing_toast) == (True, None, ())
    add(b, event("insert", lsn=30, new={"id": 1, "name": "again"}))
    doc = b.docs[(INDEX, "1")]
    assert (doc.delete, doc.lsn, source(doc)) == (False, 30, {"id": 1, "name": "again"})


def test_update_takes_unchanged_toast_from_an_older_change_of_the_batch() -> None:
    b = Batch()
    add(b, event("insert", lsn=10, new={"id": 1, "name": "a", "bio": "B" * 3000}))
    add(
        b,
        event("update", lsn=20, new={"id": 1, "name": "b"}, unchanged_toast=["bio"]),
    )
    doc = b.docs[(INDEX, "1")]
    assert doc.source == {"id": 1, "name": "b", "bio": "B" * 3000}
    assert doc.missing_toast == ()


def test_unchanged_toast_is_carried_through_several_updates() -> None:
    b = Batch()
    add(b, event("insert", lsn=10, new={"id": 1, "name": "a", "bio": "kept"}))
    add(b, event("update", lsn=20, new={"id": 1, "name": "b"}, unchanged_toast=["bio"]))
    add(b, event("update", lsn=30, new={"id": 1, "name": "c"}, unchanged_toast=["bio"]))
    doc = b.docs[(INDEX, "1")]
    assert doc.source == {"id": 1, "name": "c", "bio": "kept"}
    assert doc.missing_toast == ()


def test_unchanged_toast_unknown_to_the_batch_stays_missing() -> None:
    b = Batch()
    add(b, event("update", lsn=10, new={"id": 1, "name": "a"}, unchanged_toast=["bio"]))
    first = b.docs[(INDEX, "1")]
    assert first.missing_toast == ("bio",)
    add(b, event("update", lsn=20, new={"id": 1, "name": "b"}, unchanged_toast=["bio"]))
    doc = b.docs[(INDEX, "1")]
    assert doc.source == {"id": 1, "name": "b"}  # no guessed value: filled from the store
    assert doc.missing_toast == ("bio",)


def test_unchanged_toast_partly_known_keeps_only_the_unknown_column() -> None:
    b = Batch()
    add(b, event("insert", lsn=10, new={"id": 1, "bio": "B"}))
    add(
        b,
        event("update", lsn=20, new={"id": 1, "name": "n"}, unchanged_toast=["bio", "notes"]),
    )
    doc = b.docs[(INDEX, "1")]
    assert doc.source == {"id": 1, "name": "n", "bio": "B"}
    assert doc.missing_toast == ("notes",)


def test_unchanged_toast_of_the_first_change_in_the_batch_stays_missing() -> None:
    b = Batch()
    add(b, event("update", lsn=10, new={"id": 1}, unchanged_toast=["bio"]))
    assert b.docs[(INDEX, "1")].missing_toast == ("bio",)


def test_table_without_key_returns_a_reason_and_adds_no_document() -> None:
    b = Batch()
    ev = event("insert", key={})
    value = raw(ev)
    reason = b.add(INDEX, decode(value), origin(value))
    assert reason is not None
    assert "no primary key or replica identity" in reason
    assert b.docs == {}
    assert (b.records, b.bytes) == (1, len(value))


def test_counters_sum_records_and_consumed_bytes_and_clear_resets() -> None:
    b = Batch()
    v1 = raw(event("insert", lsn=10))
    v2 = raw(event("update", lsn=20))
    v3 = raw(event("insert", lsn=5, key={"id": 9}))
    for v in (v1, v2, v3):
        assert b.add(INDEX, decode(v), origin(v)) is None
    assert b.records == 3
    assert b.bytes == len(v1) + len(v2) + len(v3)
    assert len(b.docs) == 2
    b.clear()
    assert (b.records, b.bytes, b.docs, len(b)) == (0, 0, {}, 0)


def test_doc_keeps_the_origin_of_its_newest_change() -> None:
    b = Batch()
    add(b, event("insert", lsn=10))
    v = raw(event("update", lsn=20))
    o = origin(v)
    b.add(INDEX, decode(v), o)
    assert b.docs[(INDEX, "1")].origin is o


# -- bulk_body --------------------------------------------------------------------------


def doc(
    id_: str, lsn: int, source: dict[str, Any] | None, *, index: str = INDEX, delete: bool = False
) -> Doc:
    return Doc(index, id_, delete, lsn, source, (), origin())


def lines(body: bytes) -> list[Any]:
    """The body's lines parsed; a document's stamp checked against the bytes that follow
    it (tests/unit/kafka2search/test_stamps.py), then left out."""
    assert body.endswith(b"\n")
    out = []
    for line in body[:-1].split(b"\n"):
        parsed = orjson.loads(line)
        if ROW_BODY in parsed:
            assert body_intact(line) is True
            del parsed[ROW_BODY]
        out.append(parsed)
    return out


def test_bulk_body_index_and_delete_actions_with_external_versions() -> None:
    body = bulk_body(
        [
            doc("1", 10, {"id": 1, "name": "ann"}),
            doc("2", 20, None, delete=True),
            doc("3", 2**40, {"id": 3}, index="other"),
        ]
    )
    assert lines(body) == [
        {"index": {"_index": INDEX, "_id": "1", "version": 10, "version_type": "external"}},
        {"id": 1, "name": "ann"},
        {"delete": {"_index": INDEX, "_id": "2", "version": 20, "version_type": "external"}},
        {
            "index": {
                "_index": "other",
                "_id": "3",
                "version": 2**40,
                "version_type": "external",
            }
        },
        {"id": 3},
    ]


def test_bulk_body_delete_has_no_source_line() -> None:
    body = bulk_body([doc("7", 5, None, delete=True)])
    assert body.count(b"\n") == 1
    assert lines(body) == [
        {"delete": {"_index": INDEX, "_id": "7", "version": 5, "version_type": "external"}}
    ]


@pytest.mark.parametrize(
    "id_",
    ['say "hi"', "back\\slash", "new\nline", "ünïcødé 🐘", '["a",1]', "tab\there", "\u2028"],
)
def test_bulk_body_escapes_ids(id_: str) -> None:
    body = bulk_body([doc(id_, 1, {"k": id_})])
    (action, source) = lines(body)
    assert action["index"]["_id"] == id_
    assert source == {"k": id_}
    assert body.count(b"\n") == 2  # a newline in the id does not break the NDJSON framing


def test_bulk_body_escapes_index_names() -> None:
    body = bulk_body([doc("1", 1, None, index='we"ird\\ünï', delete=True)])
    assert lines(body)[0]["delete"]["_index"] == 'we"ird\\ünï'


def test_bulk_body_ends_with_a_newline() -> None:
    assert bulk_body([doc("1", 1, {"a": 1})]).endswith(b"}\n")
    assert bulk_body([doc("1", 1, None, delete=True)]).endswith(b"}\n")


# -- the row as raw JSON ----------------------------------------------------------------


def test_the_row_is_the_source_line_byte_for_byte() -> None:
    """Never decoded and encoded again: "1.50" and 1.50 reach the engine as written,
    after verify's fields (the row hash and the transaction of the version)."""
    row = b'{"id":1,"price":"1.50","ratio":1.50,"name":"\\u00e9"}'
    value = b'{"v":1,"op":"insert","db":"app","schema":"public","table":"t","lsn":5,"xid":77,'
    value += b'"key":{"id":1},"new":' + row + b',"hash":4294967295,"types":{"id":"int4"}}'
    b = Batch()
    b.add(INDEX, decode(value), origin(value))
    body = bulk_body(list(b.docs.values()))
    crc = zlib.crc32(b"," + row[1:])  # the stamp: the CRC of what follows it
    want = b'{"_walcast_hash":4294967295,"_walcast_xid":77,"_walcast_body":%d,' % crc + row[1:]
    assert body.split(b"\n")[1] == want


@pytest.mark.parametrize(
    ("new", "extra", "want"),
    [
        (b'{"id":1}', b',"hash":5', {ROW_HASH: 5, ROW_XID: 9, "id": 1}),
        # an update that left a TOAST value out: no hash (unknown), the xid still
        (b'{"id":1}', b',"unchanged_toast":["big"]', {ROW_XID: 9, "id": 1}),
        (b"{}", b',"hash":5', {ROW_HASH: 5, ROW_XID: 9}),  # a row without columns
        (b"{ \n }", b"", {ROW_XID: 9}),
    ],
    ids=["hashed", "toast", "empty", "blank"],
)
def test_every_written_version_carries_verifys_fields(
    new: bytes, extra: bytes, want: dict[str, Any]
) -> None:
    value = b'{"v":1,"op":"update","db":"app","schema":"public","table":"t","lsn":5,"xid":9,'
    value += b'"key":{"id":1},"new":' + new + extra + b',"types":{"id":"int4"}}'
    b = Batch()
    assert b.add(INDEX, decode(value), origin(value)) is None
    body = bulk_body(list(b.docs.values()))
    assert lines(body)[1] == want


def test_a_read_row_is_written_by_transaction_zero_and_a_fill_keeps_the_held_fields() -> None:
    value = b'{"v":1,"op":"read","db":"app","schema":"public","table":"t","lsn":5,"xid":0,'
    value += b'"key":{"id":1},"new":{"id":1},"hash":8,"types":{"id":"int4"}}'
    b = Batch()
    b.add(INDEX, decode(value), origin(value))
    assert lines(bulk_body(list(b.docs.values())))[1] == {ROW_HASH: 8, ROW_XID: 0, "id": 1}
    held = {ROW_XID: 3, "id": 1, "big": "x"}  # a held partial version, its hash unknown
    fill = Doc(INDEX, "1", False, 9, held, (), origin(), fill=True)
    assert lines(bulk_body([fill]))[1] == held


def test_a_row_written_over_several_lines_is_put_on_one() -> None:
    value = b'{"v":1,"op":"insert","db":"app","schema":"public","table":"t","lsn":5,'
    value += b'"key":{"id":1},"new":{\n  "id": 1,\n  "name": "ann"\n}}'
    b = Batch()
    b.add(INDEX, decode(value), origin(value))
    body = bulk_body(list(b.docs.values()))
    assert body.count(b"\n") == 2
    assert lines(body)[1] == {ROW_XID: 0, "id": 1, "name": "ann"}


def test_fields_the_service_does_not_read_are_skipped() -> None:
    ev = event(future={"nested": [1, 2, {"x": None}]}, old={"id": 0})
    assert read_back(decode(raw(ev))) == kept(ev)


def test_equal_types_are_decoded_once_and_shared() -> None:
    a = decode(raw(event(lsn=1))).column_types()
    looked_up = contract_event._column_types.cache_info()
    b = decode(raw(event(lsn=2))).column_types()
    # The same text as the previous event's: recognised without even a cache lookup.
    assert contract_event._column_types.cache_info() == looked_up
    c = decode(raw(event(types={"id": "int8"}))).column_types()
    assert a is b
    assert a == {"id": "int4", "name": "text", "bio": "text"}
    assert c == {"id": "int8"}


def test_a_merge_of_unchanged_toast_decodes_only_the_documents_it_touches() -> None:
    b = Batch()
    add(b, event("insert", lsn=10, new={"id": 1, "name": "a", "bio": "kept"}))
    add(b, event("insert", lsn=11, key={"id": 2}, new={"id": 2, "name": "x"}))
    add(b, event("update", lsn=20, new={"id": 1, "name": "b"}, unchanged_toast=["bio"]))
    assert b.docs[(INDEX, "1")].source == {"id": 1, "name": "b", "bio": "kept"}
    assert isinstance(b.docs[(INDEX, "2")].source, msgspec.Raw)  # untouched


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(raw(event(op=["insert"])), "unknown op ['insert']", id="op-list"),
        pytest.param(raw(event(op={"x": 1})), "unknown op {'x': 1}", id="op-object"),
        pytest.param(
            b'{"v":1,"op":"insert","x":' + b"[" * 5000 + b"]" * 5000 + b"}",
            "not JSON",
            id="nested-too-deeply",
        ),
        pytest.param(raw(event(lsn=2**63)), "'lsn'", id="lsn-beyond-a-java-long"),
    ],
)
def test_parse_rejects_what_a_typed_decoder_would_trip_on(value: bytes, reason: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode(value)
    assert reason in str(info.value)


def test_the_largest_version_the_engines_take_is_accepted() -> None:
    assert decode(raw(event(lsn=2**63 - 1))).lsn == 2**63 - 1


def invalid_row_event(lsn: int, toast: bool) -> bytes:
    """An event whose row the event decoder passes over unchecked (invalid UTF-8)."""
    value = b'{"v":1,"op":"update","db":"app","schema":"public","table":"t","lsn":%d,' % lsn
    value += b'"key":{"id":1},"new":{"id":1,"name":"\xff"}'
    return value + (b',"unchanged_toast":["bio"]}' if toast else b"}")


def test_a_row_to_merge_into_that_is_not_json_is_refused_with_a_reason() -> None:
    b = Batch()
    value = invalid_row_event(10, toast=True)
    reason = b.add(INDEX, decode(value), origin(value))
    assert reason is not None
    assert "not valid JSON" in reason
    assert b.docs == {}


def test_an_older_row_that_is_not_json_gives_nothing_to_a_merge() -> None:
    b = Batch()
    value = invalid_row_event(10, toast=False)
    assert b.add(INDEX, decode(value), origin(value)) is None  # passed on: the engine refuses it
    add(b, event("update", lsn=20, new={"id": 1, "name": "b"}, unchanged_toast=["bio"]))
    doc = b.docs[(INDEX, "1")]
    assert (doc.source, doc.missing_toast) == ({"id": 1, "name": "b"}, ("bio",))
