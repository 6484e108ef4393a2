"""Every type of the type table, an array of each, and the types outside it (an enum, a
domain, a range, geometric types) from a source table through pg2kafka's events into the
target table, compared with plain SQL on both sides: each column's text output, and
``to_jsonb`` of the row. The values that are hardest to carry: ``infinity``, dates BC and
past 9999, ``NaN`` and ``±Infinity``, a ``json`` value's own spacing and key order next
to ``jsonb``'s, bytea, arrays with NULLs and of several dimensions, char(n) padding."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import Harness, HarnessFactory
from tests.integration.kafka2postgres.conftest import ReplicaFactory, table_schema
from tests.integration.test_snapshot_sinks import ends
from tests.integration.test_type_walk import CASES, OTHERS

EXTRA: dict[str, tuple[str, str]] = {
    # column: (type, SQL literal) beyond the type walk's one value per type
    "x_json_spacing": ("json", """'{"b" : 1,  "a": [1, 2.50, null], "b": 2}'"""),
    "x_float_nan": ("float8", "'NaN'"),
    "x_float_inf": ("float4", "'-Infinity'"),
    "x_numeric_nan": ("numeric", "'NaN'"),
    "x_numeric_scale": ("numeric(8,2)", "1.5"),
    "x_date_bc": ("date", "'0044-03-15 BC'"),
    "x_date_far": ("date", "'12345-01-01'"),
    "x_date_inf": ("date", "'-infinity'"),
    "x_ts_bc": ("timestamp", "'0001-01-01 00:00:00 BC'"),
    "x_tstz_inf": ("timestamptz", "'infinity'"),
    "x_tstz_bc": ("timestamptz", "'0044-03-15 12:00:00+00 BC'"),
    "x_dates": ("date[]", "ARRAY['0044-03-15 BC', NULL, 'infinity', '2024-02-29']::date[]"),
    "x_bytea_2d": ("bytea[]", r"ARRAY[['\x00', NULL], ['\xff10', '\x']]::bytea[]"),
    "x_int_2d": ("int4[]", "ARRAY[[1, 2], [3, NULL]]"),
    "x_text_odd": ("text[]", """ARRAY['a"b', 'c\\d', 'NULL', NULL, '', '{x,y}']"""),
    "x_jsonb_arr": ("jsonb[]", """ARRAY['{"a": 1}', NULL, '[1, "x"]']::jsonb[]"""),
    "x_char_pad": ("char(5)", "'ab'"),
    "x_interval": ("interval", "'-1 year 2 mons -3 days 04:05:06.789'"),
}


def _make(h: Harness, dsn_target: str, r: Any) -> tuple[str, list[str]]:
    table = f"walk_{h.settings.replication.slot[-8:]}"
    for sql in (
        "DO $$ BEGIN CREATE TYPE walk_mood AS ENUM ('happy', 'sad');"
        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
        "DO $$ BEGIN CREATE DOMAIN walk_pos AS int4 CHECK (VALUE > 0);"
        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
    ):
        h.sql(sql)
        r.sql(sql)  # the target has the source's own types (kafka2postgres does not make them)
    cols = []
    for name, (sql_type, literal) in {**CASES, **OTHERS}.items():
        array = f"ARRAY[{literal}, NULL]::{sql_type}[]"
        cols += [(f"c_{name}", sql_type, literal), (f"a_{name}", f"{sql_type}[]", array)]
    cols += [(c, t, v) for c, (t, v) in EXTRA.items()]
    columns = ", ".join(f"{c} {t}" for c, t, _ in cols)
    h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, {columns})")
    names = ", ".join(c for c, _, _ in cols)
    h.sql(f"INSERT INTO {table} (id, {names}) VALUES (1, {', '.join(v for _, _, v in cols)})")
    h.sql(f"INSERT INTO {table} (id) VALUES (2)")  # every column NULL
    return table, [c for c, _, _ in cols]


def _texts(dsn_run: Any, table: str, cols: list[str]) -> dict[int, dict[str, Any]]:
    """Each column's text output, and the row's to_jsonb, by id (plain SQL)."""
    exprs = ", ".join(f"{c}::text" for c in cols)
    rows = dsn_run(f"SELECT id, to_jsonb(t)::text, {exprs} FROM public.{table} t ORDER BY id")
    return {r[0]: {"to_jsonb": r[1], **dict(zip(cols, r[2:], strict=True))} for r in rows}


@pytest.mark.parametrize("order", ["streamed", "snapshotted"])
def test_every_type_and_its_array_arrive_exactly(
    make_harness: HarnessFactory, make_replica: ReplicaFactory, order: str
) -> None:
    """``streamed``: the table created with pg2kafka running (its CREATE TABLE carries
    the exact types); ``snapshotted``: the table was there before the slot and comes by the
    initial snapshot (its start marker carries the table's schema: the target table is
    made with the exact types, though no DDL event described it)."""
    if order == "streamed":
        h = make_harness()
        r = make_replica(h.settings.producer.topic)
        table, cols = _make(h, r.dsn, r)
        h.start()
    else:
        h = make_harness(init=False, snapshot={"mode": "initial"})
        r = make_replica(h.settings.producer.topic)
        table, cols = _make(h, r.dsn, r)
        from services.pg2kafka import admin

        admin.init(h.settings)
        h.start()
        h.events(lambda seen: ends(seen, table) == 1)  # the snapshot read the table
    r.start()
    r.wait_equal(h.dsn, f"public.{table}", "id")
    want = _texts(h.sql, table, cols)
    got = _texts(r.sql, table, cols)
    for i in (1, 2):
        bad = {c: (want[i][c], got[i][c]) for c in want[i] if want[i][c] != got[i][c]}
        assert bad == {}, f"row {i}"
    (got_cols, got_key), (want_cols, want_key) = (
        table_schema(r.dsn, f"public.{table}"), table_schema(h.dsn, f"public.{table}"))  # fmt: skip
    assert [c for c in got_cols if c not in want_cols] == [], "columns the source lacks"
    assert got_cols == want_cols
    assert got_key == want_key
    assert got[1]["x_json_spacing"] == """{"b" : 1,  "a": [1, 2.50, null], "b": 2}"""


def test_a_json_null_and_an_sql_null_are_one_value_in_an_event(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    """The one value that does not come back as it was (docs/kafka2postgres.md, "Types"):
    a json or jsonb value that is JSON ``null`` travels as ``null``, like SQL NULL, and
    the target holds SQL NULL."""
    h = make_harness()
    table = f"jnull_{h.settings.replication.slot[-8:]}"
    h.start()
    h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, j jsonb, a jsonb[])")
    h.sql(f"INSERT INTO {table} VALUES (1, 'null', ARRAY['null', '1']::jsonb[])")
    r = make_replica(h.settings.producer.topic).start()
    r.wait(lambda: len(r.sql(f"SELECT 1 FROM public.{table}") if _exists(r, table) else []) == 1,
           "the row in the target")  # fmt: skip
    assert h.sql(f"SELECT j IS NULL, a::text FROM {table}") == [(False, '{"null",1}')]
    assert r.sql(f"SELECT j IS NULL, a::text FROM public.{table}") == [(True, "{NULL,1}")]


def _exists(r: Any, table: str) -> bool:
    return r.sql("SELECT to_regclass(%s) IS NOT NULL", [f"public.{table}"]) == [(True,)]
