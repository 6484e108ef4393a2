"""How consumers read renames from DDL events (shared.contract.ddl): by column number,
never guessed from the statement text."""

from __future__ import annotations

from shared.contract.ddl import column_numbers, renames

MIGRATION = "ALTER TABLE t RENAME COLUMN a TO b; ALTER TABLE u DROP COLUMN x, ADD COLUMN y int"


def test_a_rename_is_a_column_that_kept_its_number() -> None:
    numbers = column_numbers([{"name": "id", "num": 1}, {"name": "b", "num": 2}])
    assert renames(["a"], ["b"], {"id": 1, "a": 2}, numbers, "anything") == [("a", "b")]


def test_a_drop_and_an_add_are_never_a_rename_even_with_rename_in_the_text() -> None:
    """Before: a multi-statement migration with an unrelated RENAME moved table u's column
    x's data into its new column y."""
    numbers = {"id": 1, "y": 3}
    assert renames(["x"], ["y"], {"id": 1, "x": 2}, numbers, MIGRATION) == []


def test_without_numbers_only_a_rename_the_statement_names_exactly() -> None:
    assert renames(["a"], ["b"], {}, {}, MIGRATION) == [("a", "b")]
    assert renames(["x"], ["y"], {}, {}, MIGRATION) == []  # u's drop and add
    assert renames(["Old Name"], ["new"], {}, {}, 'ALTER TABLE t RENAME "Old Name" TO NEW') == [
        ("Old Name", "new")
    ]


def test_column_numbers_of_an_event_without_them() -> None:
    assert column_numbers(None) == {}
    assert column_numbers([{"name": "a", "type": "int4"}]) == {}
