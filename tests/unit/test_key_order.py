"""The one order of keys every side shares (shared/contract/keyorder.py): which collations
compare text by code point, the index a text key under another collation needs, and how a
search index compares a text key (its keyword, long enough for any key)."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import pytest
from psycopg import sql

from services.kafka2search.mapping import KEY_KEYWORD_CHARS, has_key_fields, key_field, properties
from shared.contract.keyorder import (
    KeyColumn,
    byte_ordered,
    c_index_statement,
    key_expr,
    key_text,
    sortable_sql,
)


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


def _random_times(n: int, seed: int) -> list[datetime]:
    rnd = random.Random(seed)
    base = datetime(1, 1, 1)
    span = int((datetime(9999, 12, 31, 23, 59, 59, 999999) - base).total_seconds())
    out = []
    for _ in range(n):
        t = base + timedelta(seconds=rnd.randrange(span))
        # fractions of every length, and many times within one millisecond
        t = t.replace(microsecond=rnd.choice([0, 500000, 510000, 500001, 999999,
                                              rnd.randrange(10**6)]))  # fmt: skip
        out.append(t)
    return out


def test_dates_and_timestamps_sort_by_their_event_text_as_by_their_value() -> None:
    """The order a search engine's keyword and every string comparison give a time key's
    text is its time order — dates, timestamps, and aware ones in UTC (``+00:00``) —
    within years 1 to 9999, and the text is the same whether read as a value or as
    Postgres's text output."""
    times = _random_times(3000, 7)
    assert sorted(times) == sorted(times, key=key_text)
    aware = [t.replace(tzinfo=UTC) for t in times]
    assert sorted(aware) == sorted(aware, key=key_text)
    days = [t.date() for t in times]
    assert sorted(days) == sorted(days, key=key_text)
    for t in aware[:300]:
        pg_text = t.isoformat(sep=" ").replace("+00:00", "+00")
        if t.microsecond:
            pg_text = pg_text.replace(f".{t.microsecond:06d}", f".{t.microsecond:06d}".rstrip("0"))
        assert key_text(pg_text) == key_text(t), pg_text
        assert datetime.fromisoformat(key_text(t)) == t
    assert key_text(datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)) == (
        "2026-01-02T03:04:05.5+00:00"
    )
    assert key_text(date(5, 1, 2)) == "0005-01-02"
    # other forms stay as they are: sortable_sql keeps them out of every comparison
    assert key_text("infinity") == "infinity"
    assert key_text("0044-03-15 BC") == "0044-03-15 BC"


def test_a_time_key_is_compared_by_its_text_beside_its_date_field() -> None:
    """A ``date`` field keeps milliseconds: a date or timestamp key column is mapped with
    a keyword of its text, which verify and key ranges compare (an index without it is
    named by ``has_key_fields``)."""
    props = properties({"at": "timestamptz", "n": "int4", "d": "date"}, keys=["at", "d"])
    assert props["at"]["type"] == "date"
    assert props["at"]["fields"]["key"] == {"type": "keyword"}
    assert "fields" not in props["n"]
    assert key_field("at", "timestamptz") == "at.key"
    assert key_field("d", "date") == "d.key"
    old = {"at": {"type": "date"}, "d": props["d"]}
    assert has_key_fields(old, {"at": "timestamptz", "d": "date", "n": "int4"}) == ["at"]
    assert sortable_sql(sql.Identifier("at"), "timestamptz") is not None
    assert sortable_sql(sql.Identifier("n"), "int4") is None
