"""The bulk path's plan (services/kafka2postgres/copying.py): which tables and values it
takes as they are, and what sends a batch the guarded way."""

from __future__ import annotations

import orjson
import pytest

from services.kafka2postgres.batch import Change
from services.kafka2postgres.copying import NotPlain, plan
from services.kafka2postgres.schema import Column, TableSchema


def schema(*cols: tuple[str, str], key: tuple[str, ...] = ("id",)) -> TableSchema:
    return TableSchema(tuple(Column(n, t, t) for n, t in (("id", "int4"), *cols)), key, True)


def change(row: dict[str, object] | bytes, version: int = 10, h: int | None = 3) -> Change:
    raw = row if isinstance(row, bytes) else orjson.dumps(row)
    return Change(version, False, raw, None, h, 0, True)


def test_values_go_as_the_event_carried_them_and_versions_as_array_text() -> None:
    p = plan("s", "t", schema(("n", "numeric"), ("f", "float8"), ("b", "bool"), ("d", "date"),
                              ("x", "bytea"), ("e", "walk_mood")))  # fmt: skip
    assert p is not None
    assert not p.raw
    rows, params = p.rows([
        change({"id": 1, "n": "1.50", "f": "NaN", "b": True, "d": "2024-02-29", "x": "AP8Q",
                "e": "happy"}),
        change({"id": 2}, version=11, h=None),
    ])  # fmt: skip
    assert rows == [(1, "1.50", "NaN", True, "2024-02-29", b"\x00\xff\x10", "happy"),
                    (2, None, None, None, None, None, None)]  # fmt: skip
    assert params == {"k0": "[1,2]", "v": "{10,11}", "h": "{3,NULL}", "x": "{0,0}"}


def test_a_json_value_keeps_its_exact_text_and_its_null_is_sql_null() -> None:
    p = plan("s", "t", schema(("j", "json"), ("s", "text")))
    assert p is not None
    assert p.raw
    text = b'{"id":1,"j":{"b" : 1,  "a": [2.50], "b": 2},"s":"x\\"y"}'
    rows, _ = p.rows([change(text), change(b'{"id":2,"j":null,"s":null}')])
    assert rows == [(1, '{"b" : 1,  "a": [2.50], "b": 2}', 'x"y'), (2, None, None)]


@pytest.mark.parametrize("value", ["-0043-03-15", "+12345-01-01", "0000-01-01", "-infinity"])
def test_an_expanded_year_sends_the_batch_the_guarded_way(value: str) -> None:
    p = plan("s", "t", schema(("d", "date")))
    assert p is not None
    with pytest.raises(NotPlain):
        p.rows([change({"id": 1, "d": "2024-01-01"}), change({"id": 2, "d": value})])


@pytest.mark.parametrize("bad", [{"id": 1, "x": "not base64!"}, {"id": 1, "s": {"a": 1}}])
def test_a_value_of_another_shape_sends_the_batch_the_guarded_way(bad: dict[str, object]) -> None:
    p = plan("s", "t", schema(("x", "bytea"), ("s", "text")))
    assert p is not None
    with pytest.raises(NotPlain):
        p.rows([change(bad)])


def test_tables_the_bulk_path_does_not_take() -> None:
    assert plan("s", "t", schema(("a", "_int4"))) is None  # an array column
    assert plan("s", "t", schema(("j", "jsonb"), key=("j",))) is None  # a jsonb key
    assert plan("s", "t", schema(key=())) is None  # no key


@pytest.mark.parametrize("value", [["a", "b"], {"a": 1}])
def test_a_list_or_object_in_a_plain_table_is_never_written_as_an_array(value: object) -> None:
    """Plain tables pick their values without a call per value; a row whose JSON holds a
    list or an object is looked at value by value (psycopg would write a list as an
    array literal)."""
    p = plan("s", "t", schema(("s", "text"), ("n", "int4")))
    assert p is not None
    rows, _ = p.rows([change({"id": 1, "s": "[x] {y}", "n": 2}), change({"n": 3, "id": 2})])
    assert rows == [(1, "[x] {y}", 2), (2, None, 3)]
    with pytest.raises(NotPlain):
        p.rows([change({"id": 3, "s": value, "n": 1})])
