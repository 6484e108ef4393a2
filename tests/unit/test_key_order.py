"""The one order of keys every side shares (shared/contract/keyorder.py): which collations
compare text by code point, the index a text key under another collation needs, and how a
search index compares a text key (its keyword, long enough for any key)."""

from __future__ import annotations

import pytest
from psycopg import sql

from services.kafka2search.mapping import KEY_KEYWORD_CHARS, key_field, properties
from shared.contract.keyorder import KeyColumn, byte_ordered, c_index_statement, key_expr


@pytest.mark.parametrize(
    ("collation", "provider", "locale", "expected"),
    [
        (950, "c", "C", True),  # "C"
        (951, "c", "POSIX", True),  # "POSIX"
        (100, "c", "C.UTF-8", True),  # a database made with C.UTF-8
        (100, "c", "C.utf8", True),
        (100, "b", "C.UTF-8", True),  # the builtin provider (Postgres 17)
        (100, "c", "en_US.UTF-8", False),
        (12345, "i", "und-x-icu", False),  # ICU: its own order
        (100, "i", "C", False),  # an ICU database's datcollate is not its order
    ],
)
def test_which_collations_compare_text_by_code_point(
    collation: int, provider: str, locale: str, expected: bool
) -> None:
    assert byte_ordered(collation, provider, locale) is expected


def test_the_index_a_text_key_needs_is_named_exactly() -> None:
    key = [KeyColumn("tenant", "int4", 1), KeyColumn('na"me', "text", 2, collate_c=True)]
    assert c_index_statement(("my schema", "t"), key) == (
        'CREATE INDEX CONCURRENTLY ON "my schema"."t" ("tenant", "na""me" COLLATE "C")'
    )
    assert key_expr(sql.Identifier("k"), True).as_string(None) == '"k" COLLATE "C"'
    assert key_expr(sql.Identifier("k"), False).as_string(None) == '"k"'


def test_a_text_key_is_compared_by_its_keyword_which_holds_any_key() -> None:
    assert key_field("k", "text") == "k.keyword"
    assert key_field("k", "varchar") == "k.keyword"
    assert key_field("k", "uuid") == "k"  # a keyword itself
    assert key_field("k", "int8") == "k"
    props = properties({"k": "text", "v": "text", "n": "int4"}, keys={"k", "n"})
    assert props["k"]["fields"]["keyword"]["ignore_above"] == KEY_KEYWORD_CHARS
    assert props["v"]["fields"]["keyword"]["ignore_above"] == 256  # not a key: as before
    assert props["n"] == properties({"n": "int4"})["n"]
