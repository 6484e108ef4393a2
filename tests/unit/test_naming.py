"""Per-table sink names (shared.naming): valid for each sink and collision-free."""

from __future__ import annotations

import re

import pytest

from shared.naming import KAFKA_TOPIC, table_name

LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


@pytest.mark.parametrize(
    "table", ["Order Items", "ordér", "a/b", "x" * 300, "", ".", "..", "über-größe", "a\tb"]
)
def test_topics_from_any_table_name_are_legal(table: str) -> None:
    """ "cdc.public.Order Items" is refused by Kafka: the name is sanitised."""
    topic = table_name("cdc.{schema}.{table}", KAFKA_TOPIC, "db", "public", table)
    assert LEGAL_TOPIC.fullmatch(topic), topic
    assert topic not in (".", "..")


def test_a_plain_table_keeps_its_readable_topic() -> None:
    assert table_name("cdc.{schema}.{table}", KAFKA_TOPIC, "d", "public", "orders") == (
        "cdc.public.orders"
    )


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("public", "Order Items"), ("public", "Order_Items")),
        (("public", "Orders"), ("public", "orders")),
        (("a.b", "c"), ("a", "b.c")),
        (("public", "x" * 300), ("public", "x" * 301)),
    ],
)
def test_topics_are_collision_free(one: tuple[str, str], other: tuple[str, str]) -> None:
    a = table_name("cdc.{schema}.{table}", KAFKA_TOPIC, "d", *one)
    b = table_name("cdc.{schema}.{table}", KAFKA_TOPIC, "d", *other)
    assert a != b


def test_adjacent_fields_always_hash() -> None:
    """ "{schema}{table}" cannot be read back: ab+c and a+bc would meet."""
    a = table_name("{schema}{table}", KAFKA_TOPIC, "d", "ab", "c")
    b = table_name("{schema}{table}", KAFKA_TOPIC, "d", "a", "bc")
    assert a != b
