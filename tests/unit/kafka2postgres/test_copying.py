"""The bulk path's plan (services/kafka2postgres/copying.py and its compiled part,
native/src/copy.rs): which tables and values it takes as they are, the COPY text it
sends, and what sends a batch the guarded way. (That the server reads this text back as
the source's values is tests/integration/kafka2postgres/test_bulk.py's and the type
walk's to show.)"""

from __future__ import annotations

import orjson
import pytest

from services.kafka2postgres.batch import Change
from services.kafka2postgres.copying import NotPlain, plan
from services.kafka2postgres.schema import Column, TableSchema


def schema(
    *cols: tuple[str, str], key: tuple[str, ...] = ("id",), id_type: str = "int4"
) -> TableSchema:
    return TableSchema(tuple(Column(n, t, t) for n, t in (("id", id_type), *cols)), key, True)


def change(row: dict[str, object] | bytes, version: int = 10, h: int | None = 3) -> Change:
    raw = row if isinstance(row, bytes) else orjson.dumps(row)
    return Change(version, False, raw, None, h, 0, True)


def test_values_go_as_the_event_carried_them_and_versions_as_copy_lines() -> None:
    p = plan("s", "t", schema(("n", "numeric"), ("f", "float8"), ("b", "bool"), ("d", "date"),
                              ("x", "bytea"), ("e", "walk_mood")))  # fmt: skip
    assert p is not None
    e = p.encode([
        change({"id": 1, "n": "1.50", "f": "NaN", "b": True, "d": "2024-02-29", "x": "AP8Q",
                "e": "happy\tday"}),
        change({"id": 2}, version=11, h=None),
    ], tbl=7)  # fmt: skip
    assert e.rows == (
        b"1\t1.50\tNaN\tt\t2024-02-29\t\\\\x00ff10\thappy\\tday\n2\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\n"
    )
    assert e.versions == b"7\t(1)\t10\tf\t\\N\t3\t0\n7\t(2)\t11\tf\t\\N\t\\N\t0\n"
    assert e.params == {}


def test_a_key_only_the_server_can_print_goes_as_arrays_for_the_versions_statement() -> None:
    p = plan("s", "t", schema(("v", "text"), id_type="numeric"))
    assert p is not None
    e = p.encode([change({"id": "1.50", "v": "a"}), change({"id": "2", "v": None}, 11, None)], 7)
    assert e.versions is None
    assert e.rows == b"1.50\ta\n2\t\\N\n"
    assert e.params == {"k0": '["1.50","2"]', "v": "{10,11}", "h": "{3,NULL}", "x": "{0,0}",
                        "tbl": 7}  # fmt: skip


@pytest.mark.parametrize(
    ("value", "text"),
    [("a b", b'("a b")'), ("", b'("")'), ('q"\\', b'("q""\\\\\\\\")'), ("(x,y)", b'("(x,y)")'),
     ("plain", b"(plain)")],
)  # fmt: skip
def test_a_text_keys_text_is_quoted_as_postgres_prints_a_row(value: str, text: bytes) -> None:
    p = plan("s", "t", schema(id_type="text"))
    assert p is not None
    e = p.encode([change({"id": value})], 1)
    assert e.versions == b"1\t" + text + b"\t10\tf\t\\N\t3\t0\n"


def test_a_json_value_keeps_its_exact_text_and_its_null_is_sql_null() -> None:
    p = plan("s", "t", schema(("j", "json"), ("s", "text")))
    assert p is not None
    text = b'{"id":1,"j":{"b" : 1,  "a": [2.50], "b": 2},"s":"x\\"y"}'
    e = p.encode([change(text), change(b'{"id":2,"j":null,"s":null}')], 1)
    assert e.rows == b'1\t{"b" : 1,  "a": [2.50], "b": 2}\tx"y\n2\t\\N\t\\N\n'


@pytest.mark.parametrize("value", ["-0043-03-15", "+12345-01-01", "0000-01-01", "-infinity"])
def test_an_expanded_year_sends_the_batch_the_guarded_way(value: str) -> None:
    p = plan("s", "t", schema(("d", "date")))
    assert p is not None
    with pytest.raises(NotPlain, match="expanded year"):
        p.encode([change({"id": 1, "d": "2024-01-01"}), change({"id": 2, "d": value})], 1)


@pytest.mark.parametrize(
    "bad", [{"id": 1, "x": "not base64!"}, {"id": 1, "s": {"a": 1}}, {"id": 1, "x": 5}]
)
def test_a_value_of_another_shape_sends_the_batch_the_guarded_way(bad: dict[str, object]) -> None:
    p = plan("s", "t", schema(("x", "bytea"), ("s", "text")))
    assert p is not None
    with pytest.raises(NotPlain):
        p.encode([change(bad)], 1)


def test_tables_the_bulk_path_does_not_take() -> None:
    assert plan("s", "t", schema(("a", "_int4"))) is None  # an array column
    assert plan("s", "t", schema(("j", "jsonb"), key=("j",))) is None  # a jsonb key
    assert plan("s", "t", schema(key=())) is None  # no key


@pytest.mark.parametrize("value", [["a", "b"], {"a": 1}])
def test_a_list_or_object_in_a_plain_table_is_never_written_as_an_array(value: object) -> None:
    p = plan("s", "t", schema(("s", "text"), ("n", "int4")))
    assert p is not None
    e = p.encode([change({"id": 1, "s": "[x] {y}", "n": 2}), change({"n": 3, "id": 2})], 1)
    assert e.rows == b"1\t[x] {y}\t2\n2\t\\N\t3\n"
    with pytest.raises(NotPlain, match="nested"):
        p.encode([change({"id": 3, "s": value, "n": 1})], 1)
