"""kafka2search mapping: document ids, alias and index names, field mappings."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
import pytest

from services.kafka2search.mapping import (
    MAX_ID_BYTES,
    alias_name,
    document_id,
    field_mapping,
    index_name,
    properties,
)

# -- document_id ------------------------------------------------------------------------


def test_single_int_key_is_its_decimal_text() -> None:
    assert document_id({"id": 42}) == "42"
    assert document_id({"id": -7}) == "-7"
    assert document_id({"id": 2**63 - 1}) == "9223372036854775807"


def test_single_str_key_is_the_string_itself() -> None:
    assert document_id({"code": "abc"}) == "abc"
    assert document_id({"code": 'a "quoted", ünïcode'}) == 'a "quoted", ünïcode'
    assert document_id({"code": ""}) == ""


def test_single_non_str_non_int_key_is_json() -> None:
    assert document_id({"flag": True}) == "true"
    assert document_id({"price": 1.5}) == "1.5"
    assert document_id({"doc": {"a": 1}}) == '{"a":1}'


def test_composite_key_is_a_json_array_in_column_order() -> None:
    assert document_id({"tenant": "acme", "id": 7}) == '["acme",7]'
    assert document_id({"id": 7, "tenant": "acme"}) == '[7,"acme"]'


def test_composite_key_is_unambiguous_when_values_contain_separators() -> None:
    a = document_id({"x": "a,b", "y": 1})
    b = document_id({"x": "a", "y": "b,1"})
    c = document_id({"x": "a", "y": "b", "z": 1})
    assert a == '["a,b",1]'
    assert b == '["a","b,1"]'
    assert len({a, b, c}) == 3
    assert orjson.loads(a) == ["a,b", 1]  # reversible


def test_composite_key_keeps_int_and_str_values_apart() -> None:
    assert document_id({"a": 1, "b": 2}) != document_id({"a": "1", "b": "2"})


def test_empty_key_has_no_document_id() -> None:
    assert document_id({}) is None


def test_id_at_the_byte_limit_is_kept_as_is() -> None:
    exact = "é" * (MAX_ID_BYTES // 2)  # two bytes each: exactly the limit
    assert len(exact.encode()) == MAX_ID_BYTES
    assert document_id({"k": exact}) == exact


def test_over_long_id_is_hashed_with_a_prefix_and_fits() -> None:
    long_text = "é" * (MAX_ID_BYTES // 2 + 1)  # 514 bytes, only 257 characters
    got = document_id({"k": long_text})
    assert got == "sha256:" + hashlib.sha256(long_text.encode()).hexdigest()
    assert len(got.encode()) <= MAX_ID_BYTES


def test_over_long_composite_id_hashes_its_json_text() -> None:
    key = {"a": "x" * 300, "b": "y" * 300}
    text = orjson.dumps(["x" * 300, "y" * 300])
    got = document_id(key)
    assert got == "sha256:" + hashlib.sha256(text).hexdigest()


def test_distinct_over_long_ids_hash_differently_and_deterministically() -> None:
    a = document_id({"k": "a" * 1000})
    b = document_id({"k": "a" * 999 + "b"})
    assert a is not None
    assert b is not None
    assert a != b
    assert a == document_id({"k": "a" * 1000})
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a)


# -- alias_name / index_name ------------------------------------------------------------


HASHED = r"-[0-9a-f]{10}"


def test_alias_of_a_plain_table_is_the_filled_template() -> None:
    assert alias_name("walcast-{schema}.{table}", "app", "sales", "orders") == (
        "walcast-sales.orders"
    )
    assert alias_name("{db}_{schema}.{table}", "shop", "public", "items") == "shop_public.items"


def test_alias_lower_cases_with_a_hash_so_case_twins_differ() -> None:
    upper = alias_name("walcast-{schema}.{table}", "app", "Sales", "Orders")
    assert re.fullmatch(r"walcast-sales\.orders" + HASHED, upper)
    assert upper != alias_name("walcast-{schema}.{table}", "app", "sales", "orders")


@pytest.mark.parametrize("char", list('\\/*?"<>| ,#:'))
def test_alias_replaces_characters_the_engines_refuse(char: str) -> None:
    got = alias_name("wc-{table}", "d", "s", f"a{char}b")
    assert re.fullmatch(r"wc-a_b" + HASHED, got)
    assert got != alias_name("wc-{table}", "d", "s", "a_b")


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("s", "a b"), ("s", "a_b")),
        (("a.b", "c"), ("a", "b.c")),
        (("Orders", "x"), ("orders", "x")),
        (("a_b", "c"), ("a", "b_c")),  # under a template that joins with "_"
    ],
)
def test_tables_never_share_an_alias(one: tuple[str, str], other: tuple[str, str]) -> None:
    for template in ("walcast-{schema}.{table}", "{schema}_{table}"):
        assert alias_name(template, "d", *one) != alias_name(template, "d", *other)


@pytest.mark.parametrize("table", ["-abc", "_abc", "+abc", " abc"])
def test_alias_strips_leading_dash_underscore_plus(table: str) -> None:
    assert re.fullmatch(r"abc" + HASHED, alias_name("{table}", "d", "s", table))


@pytest.mark.parametrize("table", ["", "___", "-+-", ".", ".."])
def test_alias_that_would_be_empty_or_dots_falls_back_to_walcast(table: str) -> None:
    assert re.fullmatch(r"walcast" + HASHED, alias_name("{table}", "d", "s", table))


def test_alias_is_capped_at_200_characters() -> None:
    got = alias_name("walcast-{table}", "d", "s", "t" * 500)
    assert len(got) == 200
    assert re.fullmatch(r"walcast-t+" + HASHED, got)
    assert got != alias_name("walcast-{table}", "d", "s", "t" * 501)


def test_alias_of_a_non_ascii_template_stays_within_the_engine_byte_limit() -> None:
    got = alias_name("ü" * 150 + "-{table}", "d", "s", "t")
    assert len(index_name(got).encode()) <= 255


def test_alias_does_not_interpret_braces_in_identifiers() -> None:
    assert re.fullmatch(r"wc-\{db\}" + HASHED, alias_name("wc-{table}", "d", "s", "{db}"))


def test_index_name_is_the_alias_with_a_version_suffix() -> None:
    assert index_name("walcast-public.users") == "walcast-public.users-v1"
    assert index_name("walcast-public.users", 2) == "walcast-public.users-v2"


# -- field_mapping / properties ---------------------------------------------------------

KEYWORD = {"type": "keyword", "ignore_above": 8191}
TEXT = {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
DATE = {
    "type": "date",
    "format": "strict_date_optional_time||epoch_millis",
    "ignore_malformed": True,  # infinity: kept in _source, not dead-lettered
}


@pytest.mark.parametrize(
    ("pg_type", "expected"),
    [
        ("int2", {"type": "short"}),
        ("int4", {"type": "integer"}),
        ("int8", {"type": "long"}),
        ("float8", {"type": "double", "ignore_malformed": True}),
        ("numeric", {"type": "double", "ignore_malformed": True}),
        ("bool", {"type": "boolean"}),
        ("text", TEXT),
        ("varchar", TEXT),
        ("uuid", KEYWORD),
        ("timestamptz", DATE),
        ("date", DATE),
        ("jsonb", {"type": "object", "enabled": False}),
        ("bytea", {"type": "binary"}),
        ("money", KEYWORD),
        ("interval", KEYWORD),
    ],
)
def test_field_mapping_of_postgres_types(pg_type: str, expected: dict[str, Any]) -> None:
    assert field_mapping(pg_type) == expected


@pytest.mark.parametrize(
    ("array_type", "expected"),
    [
        ("_int4", {"type": "integer"}),
        ("_text", TEXT),
        ("_timestamptz", DATE),
        ("_jsonb", {"type": "object", "enabled": False}),
        ("_uuid", KEYWORD),
    ],
)
def test_array_types_map_like_their_elements(array_type: str, expected: dict[str, Any]) -> None:
    assert field_mapping(array_type) == expected
    assert field_mapping(array_type) == field_mapping(array_type[1:])


@pytest.mark.parametrize("pg_type", ["mood_enum", "tsrange", "point", "_mood_enum", "", "INT4"])
def test_unknown_types_map_to_keyword(pg_type: str) -> None:
    assert field_mapping(pg_type) == KEYWORD


def test_properties_maps_every_column() -> None:
    got = properties({"id": "int8", "name": "text", "tags": "_varchar", "mood": "mood"})
    assert got == {
        "id": {"type": "long"},
        "name": TEXT,
        "tags": TEXT,
        "mood": KEYWORD,
    }
    assert properties({}) == {}


def test_properties_can_be_serialised_for_the_engine() -> None:
    got = properties({"a": "int4", "b": "text"})
    assert orjson.loads(orjson.dumps(got)) == got


@pytest.mark.parametrize(
    ("chars", "hashed"), [(MAX_ID_BYTES // 4, False), (MAX_ID_BYTES // 4 + 1, True)]
)
def test_four_byte_characters_are_measured_in_bytes(chars: int, hashed: bool) -> None:
    text = "🐘" * chars  # 4 bytes each: 512 bytes is the limit, 516 is over
    got = document_id({"k": text})
    assert got is not None
    assert got.startswith("sha256:") is hashed


# -- no key takes another key's id (issue 36, finding 7) ----------------------------------


def test_a_key_spelling_another_keys_hash_gets_an_id_of_its_own() -> None:
    """A text key equal to ``sha256:<hex of a key longer than 512 bytes>`` took that
    key's document id, so either row overwrote the other's document."""
    long_key = "x" * (MAX_ID_BYTES + 1)
    forged = "sha256:" + hashlib.sha256(long_key.encode()).hexdigest()
    assert document_id({"k": forged}) != document_id({"k": long_key})
    assert document_id({"k": forged}) == "sha256:" + hashlib.sha256(forged.encode()).hexdigest()


def test_only_keys_that_start_like_a_hash_change_their_ids() -> None:
    """Existing indices keep matching: every other key's id is what it was."""
    for key, was in [({"id": 42}, "42"), ({"c": "abc"}, "abc"), ({"c": "sha256"}, "sha256"),
                     ({"c": "SHA256:x"}, "SHA256:x"), ({"c": "x sha256:y"}, "x sha256:y"),
                     ({"a": "sha256:x", "b": 1}, '["sha256:x",1]')]:  # fmt: skip
        assert document_id(key) == was
    assert document_id({"c": "sha256:"}) == "sha256:" + hashlib.sha256(b"sha256:").hexdigest()


def test_a_key_that_cannot_be_written_as_text_gets_a_reason_not_a_crash() -> None:
    from shared.contract.event import EventDecodeError

    with pytest.raises(EventDecodeError, match="64-bit"):
        document_id({"a": 2**70, "b": 1})


def test_the_document_id_is_computed_in_one_place() -> None:
    """Every id the service writes or reads comes from document_id (its callers)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "services" / "kafka2search"
    callers = sorted(
        p.name for p in root.glob("*.py") if re.search(r"\bdocument_id\(", p.read_text())
    )
    assert callers == ["documents.py", "mapping.py"]
    assert "sha256" not in (root / "documents.py").read_text()
    assert "hashlib" not in (root / "app.py").read_text()
