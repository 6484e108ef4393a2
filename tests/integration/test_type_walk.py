"""Every type of the type table, and an array of each, end to end: a Postgres value → the
change event → the search document → the Delta column, each read back and compared with
what Postgres itself says the value is (plain SQL, plain HTTP, the ``deltalake`` reader).

The expectations are written in Postgres's own terms, not walcast's: an event value is
``to_jsonb(column)`` with the documented exceptions (numeric as its exact text, bytea as
base64, xid / oid as numbers); a Delta value is the Python value psycopg reads, or the
text output where the column is a string. Types outside the table (an enum, a range, a
domain, a geometric type with its own array delimiter) travel as their text output, named
by ``pg_type``.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from services.kafka2spark.schema import spark_type
from shared.contract import pgtypes
from tests.integration.conftest import Harness, HarnessFactory, data
from tests.integration.kafka2search.conftest import (  # noqa: F401 - fixtures
    IndexerFactory,
    engine_kind,
    make_indexer,
)
from tests.integration.kafka2spark.conftest import (  # noqa: F401 - fixtures
    MirrorFactory,
    make_mirror,
    spark,
)

# One value per type of the table: adding a type to the table means adding its case here
# (test_every_table_type_has_a_case fails otherwise). (column type, SQL literal)
CASES: dict[str, tuple[str, str]] = {
    "bool": ("bool", "true"),
    "bytea": ("bytea", r"'\x00ff10'::bytea"),
    "char": ('"char"', "'a'"),
    "name": ("name", "'walcast'"),
    "int8": ("int8", "9007199254740993"),  # not representable as a double
    "int2": ("int2", "-32768"),
    "int4": ("int4", "2147483647"),
    "text": ("text", """'héllo "quoted" \\ back'"""),
    "oid": ("oid", "4294967295"),
    "xid": ("xid", "'12345'"),
    "json": ("json", """'{"a": [1, 2.5, null]}'"""),
    "xml": ("xml", "'<a>x</a>'"),
    "cidr": ("cidr", "'10.0.0.0/8'"),
    "float4": ("float4", "1.5"),
    "float8": ("float8", "0.1"),
    "macaddr8": ("macaddr8", "'08:00:2b:01:02:03:04:05'"),
    "money": ("money", "12.34"),
    "macaddr": ("macaddr", "'08:00:2b:01:02:03'"),
    "inet": ("inet", "'192.168.0.1/24'"),
    "bpchar": ("char(3)", "'ab'"),
    "varchar": ("varchar(10)", "'v'"),
    "date": ("date", "'2024-02-29'"),
    "time": ("time", "'13:14:15.123456'"),
    "timestamp": ("timestamp", "'2024-02-29 13:14:15.123456'"),
    "timestamptz": ("timestamptz", "'2024-02-29 13:14:15.123456+02'"),
    "interval": ("interval", "'1 day 2 hours 3.5 seconds'"),
    "timetz": ("timetz", "'13:14:15+02'"),
    "bit": ("bit(3)", "B'101'"),
    "varbit": ("varbit", "B'1101'"),
    "numeric": ("numeric", "12345678901234567890.123456789"),
    "uuid": ("uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"),
    "tsvector": ("tsvector", "'a fat cat'"),
    "jsonb": ("jsonb", """'{"k": {"n": 1}}'"""),
}

# Outside the table: their text output, named by pg_type.typname.
OTHERS: dict[str, tuple[str, str]] = {
    "walk_mood": ("walk_mood", "'happy'"),
    "walk_pos": ("walk_pos", "42"),
    "int4range": ("int4range", "'[1,5)'"),
    "box": ("box", "'(1,1),(0,0)'"),  # its arrays are delimited by ';'
    "point": ("point", "'(1.5,2)'"),
}

# Event values Postgres's to_jsonb spells differently, by design (docs/events.md).
EVENT_SQL: dict[str, str] = {
    "numeric": "to_jsonb({c}::text)",
    "_numeric": "to_jsonb({c}::text[])",
    "bytea": "to_jsonb(encode({c}, 'base64'))",
    "_bytea": "(SELECT jsonb_agg(encode(x, 'base64') ORDER BY i) FROM unnest({c})"
    " WITH ORDINALITY AS u(x, i))",
    "xid": "to_jsonb({c}::text::int8)",
    "_xid": "to_jsonb({c}::text[]::int8[])",
    "oid": "to_jsonb({c}::int8)",
    "_oid": "to_jsonb({c}::int8[])",
    "walk_pos": "to_jsonb({c}::int4)",  # a domain converts as its base type
    "_walk_pos": "to_jsonb({c}::int4[])",
}


# The text output where a cast to text is not it: char(n) to text drops the padding.
TEXT_SQL: dict[str, str] = {
    "bpchar": "format('%s', {c})",
    "_bpchar": "(SELECT array_agg(CASE WHEN x IS NULL THEN NULL ELSE format('%s', x) END"
    " ORDER BY i) FROM unnest({c}) WITH ORDINALITY AS u(x, i))",
}


def test_every_table_type_has_a_case() -> None:
    assert sorted(CASES) == sorted(t.name for t in pgtypes.TYPES if t.oid)


def _columns() -> list[tuple[str, str, str, str]]:
    """(column, column type, SQL value, type name as events carry it)."""
    out = []
    for name, (sql_type, literal) in {**CASES, **OTHERS}.items():
        out.append((f"c_{name}", sql_type, literal, name))
        out.append(
            (f"a_{name}", f"{sql_type}[]", f"ARRAY[{literal}, NULL]::{sql_type}[]", "_" + name)
        )
    return out


def _make_table(h: Harness) -> tuple[str, list[tuple[str, str, str, str]]]:
    table = f"walk_{h.settings.replication.slot[-8:]}"
    h.sql("DO $$ BEGIN CREATE TYPE walk_mood AS ENUM ('happy', 'sad');"
          " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$")  # fmt: skip
    h.sql("DO $$ BEGIN CREATE DOMAIN walk_pos AS int4 CHECK (VALUE > 0);"
          " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$")  # fmt: skip
    cols = _columns()
    ddl = ", ".join(f"{c} {t}" for c, t, _, _ in cols)
    h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, {ddl})")
    return table, cols


def _insert(h: Harness, table: str, cols: list[tuple[str, str, str, str]]) -> None:
    names = ", ".join(c for c, _, _, _ in cols)
    values = ", ".join(v for _, _, v, _ in cols)
    h.sql(f"INSERT INTO {table} (id, {names}) VALUES (1, {values})")
    h.sql(f"INSERT INTO {table} (id) VALUES (2)")  # every column NULL


def _expected_json(h: Harness, table: str, cols: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    exprs = [EVENT_SQL.get(n, "to_jsonb({c})").format(c=c) for c, _, _, n in cols]
    with psycopg.connect(h.dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("SET IntervalStyle = 'iso_8601'")
        conn.execute("SET extra_float_digits = 3")
        (row,) = conn.execute(f"SELECT {', '.join(exprs)} FROM {table} WHERE id = 1").fetchall()
    return {"id": 1} | {c: v for (c, _, _, _), v in zip(cols, row, strict=True)}


def _expected_delta(
    h: Harness, table: str, cols: list[tuple[str, str, str, str]]
) -> dict[str, Any]:
    """What delta-rs should read: psycopg's Python value where the column is typed, the
    text output (JSON: the parsed document) where the column is a string."""
    typed = ", ".join(c for c, _, _, _ in cols)
    texts = ", ".join(
        TEXT_SQL.get(n, "{c}::text[]" if n.startswith("_") else "{c}::text").format(c=c)
        for c, _, _, n in cols
    )
    with psycopg.connect(h.dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        conn.execute("SET extra_float_digits = 3")
        (natural,) = conn.execute(f"SELECT {typed} FROM {table} WHERE id = 1").fetchall()
        conn.execute("SET IntervalStyle = 'iso_8601'")  # psycopg cannot read it back typed
        (text,) = conn.execute(f"SELECT {texts} FROM {table} WHERE id = 1").fetchall()
    out: dict[str, Any] = {"id": 1}
    for (column, _, _, name), nat, txt in zip(cols, natural, text, strict=True):
        kind = spark_type(name).simpleString()
        element = kind.removeprefix("array<").removesuffix(">")
        base = name.removeprefix("_")
        if element == "string":
            value = txt
            if base in ("json", "jsonb"):
                value = (
                    [None if x is None else json.loads(x) for x in txt]
                    if name[0] == "_"
                    else json.loads(txt)
                )
        elif element in ("smallint", "int", "bigint"):  # psycopg reads xid as text
            value = [None if x is None else int(x) for x in nat] if name[0] == "_" else int(nat)
        elif element in ("float", "double"):
            value = [None if x is None else float(x) for x in nat] if name[0] == "_" else float(nat)
        elif element == "binary":
            value = [None if x is None else bytes(x) for x in nat] if name[0] == "_" else bytes(nat)
        else:
            value = nat
        out[column] = value
    return out


def _delta_row(path: Path, cols: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    (row,) = [r for r in rows if r["id"] == 1]
    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in ("_walcast_lsn", "_walcast_hash", "_walcast_xid"):
            continue
        name = next((n for c, _, _, n in cols if c == key), "int4")
        if name.removeprefix("_") in ("json", "jsonb") and value is not None:
            value = (
                [None if x is None else json.loads(x) for x in value]
                if name[0] == "_"
                else json.loads(value)
            )
        if isinstance(value, datetime) and value.tzinfo is not None:
            value = value.astimezone(UTC)
        out[key] = value
    return out


def _normal_natural(value: Any) -> Any:
    if isinstance(value, list):
        return [_normal_natural(v) for v in value]
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    if isinstance(value, Decimal):
        return str(value)
    return value


def test_every_type_and_its_array_from_postgres_to_search_and_delta(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,  # noqa: F811
    make_mirror: MirrorFactory,  # noqa: F811
    engine_kind: str,  # noqa: F811
    spark: SparkSession,  # noqa: F811
) -> None:
    h = make_harness()
    table, cols = _make_table(h)
    h.start()
    _insert(h, table, cols)
    h.events(lambda seen: len(data(seen, table)) >= 2)
    events = {e["new"]["id"]: e for e in data(h.seen, table)}

    # The event: every column named by pg_type, every value as Postgres says it is.
    assert events[1]["types"] == {"id": "int4"} | {c: n for c, _, _, n in cols}
    assert "1187" not in str(events[1]["types"])  # interval[] was once labelled by OID
    expected = _expected_json(h, table, cols)
    for column in expected:
        assert events[1]["new"][column] == expected[column], column
    assert events[2]["new"] == {"id": 2} | {c: None for c, _, _, _ in cols}

    # The search document: the event's row as _source; every column mapped by the table.
    ix = make_indexer(h.settings.producer.topic).start()
    ix.wait(lambda: len(ix.docs(table)) == 2, f"two documents of {table}")
    docs = ix.docs(table)
    for column in expected:
        assert docs["1"][column] == expected[column], column
    assert ix.dead_letters(1, timeout=3) == []
    assert ix.broken_stamps(table) == []  # every type's text kept byte for byte
    mapping = ix.es.request("GET", f"/{ix.alias(table)}/_mapping")
    (props,) = [m["mappings"]["properties"] for m in mapping.values()]
    for column, _, _, name in cols:
        assert props[column]["type"] == pgtypes.search_mapping(name)["type"], column

    if engine_kind != "opensearch":
        return  # the Delta mirror does not depend on the search engine: once is enough
    m = make_mirror(h.settings.producer.topic)
    m.run()
    got = _delta_row(m.path(table), cols)
    want = _expected_delta(h, table, cols)
    assert set(got) == set(want)
    for column in want:
        assert _normal_natural(got[column]) == _normal_natural(want[column]), column
    assert isinstance(got["c_date"], date)
    assert got["a_interval"] == ["P1DT2H3.5S", None]  # an array, not a string


SPECIAL_TIMES = {  # id: (date, timestamp, timestamptz) as SQL literals
    1: ("'infinity'", "'infinity'", "'infinity'"),
    2: ("'-infinity'", "'-infinity'", "'-infinity'"),
    3: ("'0044-03-15 BC'", "'0044-03-15 12:00:00 BC'", "'0044-03-15 12:00:00+00 BC'"),
    4: ("'12345-01-01'", "'12345-06-07 01:02:03.5'", "'12345-01-01 00:00:00+00'"),
    5: ("'2024-02-29'", "'2024-02-29 13:14:15'", "'2024-02-29 13:14:15+00'"),
}


def test_infinite_and_far_dates_have_a_defined_value_in_every_sink(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,  # noqa: F811
    make_mirror: MirrorFactory,  # noqa: F811
    engine_kind: str,  # noqa: F811
    spark: SparkSession,  # noqa: F811
) -> None:
    """Before: infinity, BC dates and years past 9999 became strings the engines' date
    fields refused (dead letters) and Spark quarantined. Now (docs/events.md, "Values"):
    the event carries ISO-8601 expanded years and ``infinity`` as is; the engines index
    expanded years as dates and keep infinity in _source; the Delta mirror holds infinity
    as the largest / smallest value and years outside 1..9999 as NULL, counted."""
    h = make_harness()
    t = f"times_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz)")
    h.start()
    for i, (d, ts, tz) in SPECIAL_TIMES.items():
        h.sql(f"INSERT INTO {t} VALUES ({i}, {d}, {ts}, {tz})")
    h.events(lambda seen: len(data(seen, t)) >= 5)
    rows = {e["new"]["id"]: e["new"] for e in data(h.seen, t)}
    assert rows[1] == {"id": 1, "d": "infinity", "ts": "infinity", "tz": "infinity"}
    assert rows[2]["d"] == "-infinity"
    assert rows[3] == {"id": 3, "d": "-0043-03-15", "ts": "-0043-03-15T12:00:00",
                       "tz": "-0043-03-15T12:00:00+00:00"}  # fmt: skip
    assert rows[4] == {"id": 4, "d": "+12345-01-01", "ts": "+12345-06-07T01:02:03.5",
                       "tz": "+12345-01-01T00:00:00+00:00"}  # fmt: skip

    ix = make_indexer(h.settings.producer.topic).start()
    ix.wait(lambda: len(ix.docs(t)) == 5, "all five documents (none dead-lettered)")
    assert ix.dead_letters(1, timeout=3) == []
    assert ix.docs(t)["1"]["d"] == "infinity"  # kept in _source
    found = ix.es.request(  # expanded years are dates to the engine
        "POST", f"/{ix.alias(t)}/_search",
        body={"query": {"range": {"d": {"lt": "0001-01-01"}}}},
    )  # fmt: skip
    assert [hit["_id"] for hit in found["hits"]["hits"]] == ["3"]

    if engine_kind != "opensearch":
        return
    m = make_mirror(h.settings.producer.topic)
    m.run()
    assert sum(r.beyond.get(f"public.{t}", 0) for r in m.results) == 6
    assert sum(r.quarantined for r in m.results) == 0
    got = {r["id"]: r for r in DeltaTable(str(m.path(t))).to_pyarrow_table().to_pylist()}
    assert got[1]["d"] == date(9999, 12, 31)
    assert got[1]["ts"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert got[2]["tz"] == datetime(1, 1, 1, tzinfo=UTC)
    assert (got[3]["d"], got[3]["ts"], got[3]["tz"]) == (None, None, None)
    assert (got[4]["d"], got[4]["ts"], got[4]["tz"]) == (None, None, None)
    assert got[5]["tz"] == datetime(2024, 2, 29, 13, 14, 15, tzinfo=UTC)
