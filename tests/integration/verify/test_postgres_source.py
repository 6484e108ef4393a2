"""verify's Postgres side (shared/verify/postgres.py) against the real server: ranges of
at most so many rows that cover every key, in key order, for integer, composite and uuid
keys and a partitioned table; each range's count and hash sum equal what the contract's
reference computes from COPY's text (shared/contract/rowhash.py, which pg2kafka's hashes
are held to); a range's rows with their hash and xmin; the snapshot each read was made
in; the pace; keys verify cannot order refused with what to do; a marker asked for reaches
the stream. Ranges are read by one scan and by several connections at once
(``verify.workers``): both held to the same reference."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from services.pg2kafka import admin
from services.pg2kafka.replication import SESSION_OPTIONS
from shared.contract.rowhash import row_hash
from shared.errors import UnverifiableError
from shared.verify.core import KeyRange
from shared.verify.postgres import PostgresSource
from tests.integration.conftest import HarnessFactory


@pytest.fixture
def schema(stack_env: dict[str, str], unique_name: str) -> Iterator[str]:
    name = f"vs_{unique_name}"
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def run(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def reference(dsn: str, schema: str, table: str, key: list[str]) -> dict[tuple, int]:
    """Each row's hash by the contract's reference, from COPY's text, by key."""
    with psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS) as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
            [f'"{schema}"."{table}"'])]  # fmt: skip
        out = {}
        with conn.cursor().copy(f'COPY (SELECT * FROM "{schema}"."{table}") TO STDOUT') as cp:
            for row in cp.rows():
                values = dict(zip(cols, row, strict=True))
                out[tuple(values[k] for k in key)] = row_hash(values.items())
    return out


WORKERS = pytest.mark.parametrize("workers", [1, 3], ids=["one-scan", "parallel"])


@WORKERS
def test_ranges_cover_every_key_with_the_references_sums(
    stack_env: dict[str, str], schema: str, workers: int
) -> None:
    dsn = stack_env["WALCAST_PG_DSN"]
    q = f'"{schema}"'
    run(
        dsn,
        f"CREATE TABLE {q}.t (id int8 PRIMARY KEY, v text, b bool, c char(3), d date,"
        " gone int, n numeric)",
        f"INSERT INTO {q}.t SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'v' || g END,"
        f" g % 2 = 0, 'x', '2024-01-01'::date + g, g, g / 3.0 FROM generate_series(1, 2500) g",
        f"ALTER TABLE {q}.t DROP COLUMN gone",
    )
    src = PostgresSource(dsn, workers=workers)
    ranges = list(src.ranges((schema, "t"), 1000))
    assert [(r.range.lower, r.range.upper) for r in ranges] == [
        (None, (1000,)), ((1000,), (2000,)), ((2000,), None)]  # fmt: skip
    ref = reference(dsn, schema, "t", ["id"])
    for r in ranges:
        lo = r.range.lower[0] if r.range.lower else 0
        hi = r.range.upper[0] if r.range.upper else 10**9
        want = {k: h for k, h in ref.items() if lo < int(k[0]) <= hi}
        assert r.summary.rows == len(want)
        assert r.summary.hash_sum == sum(want.values())
        assert r.snapshot.xmin <= r.snapshot.xmax
    rows, snap = src.rows((schema, "t"), KeyRange((1000,), (1005,)))
    assert {r.key: r.hash for r in rows} == {(k,): ref[(str(k),)] for k in range(1001, 1006)}
    assert all(snap.sees(r.xmin) for r in rows)
    # an empty table: one open range
    run(dsn, f"CREATE TABLE {q}.empty (id int PRIMARY KEY)")
    (only,) = src.ranges((schema, "empty"), 10)
    assert (only.range, only.summary.rows, only.summary.hash_sum) == (KeyRange(None, None), 0, 0)


@WORKERS
def test_composite_uuid_and_partitioned_tables(
    stack_env: dict[str, str], schema: str, workers: int
) -> None:
    dsn = stack_env["WALCAST_PG_DSN"]
    q = f'"{schema}"'
    run(dsn, f"CREATE TABLE {q}.pair (a int, b uuid, v text, PRIMARY KEY (a, b))",
        f"INSERT INTO {q}.pair SELECT g % 5, gen_random_uuid(), 'x' FROM generate_series(1, 90) g",
        f"CREATE TABLE {q}.p (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
        f"CREATE TABLE {q}.p1 PARTITION OF {q}.p FOR VALUES FROM (0) TO (50)",
        f"CREATE TABLE {q}.p2 PARTITION OF {q}.p FOR VALUES FROM (50) TO (100)",
        f"INSERT INTO {q}.p SELECT g, 'p' FROM generate_series(0, 99) g")  # fmt: skip
    src = PostgresSource(dsn, workers=workers)
    pair = list(src.ranges((schema, "pair"), 25))
    assert [r.summary.rows for r in pair] == [25, 25, 25, 15]
    assert pair[0].range.upper is not None
    assert pair[0].range.upper[0] <= pair[1].range.upper[0]  # type: ignore[index,operator]
    ref = reference(dsn, schema, "pair", ["a", "b"])
    assert sum(r.summary.hash_sum for r in pair) == sum(ref.values())
    seen = [row.key for r in pair for row in src.rows((schema, "pair"), r.range)[0]]
    assert sorted(seen, key=str) == sorted(((int(a), uuid.UUID(b)) for a, b in ref), key=str)
    part = list(src.ranges((schema, "p"), 60))
    assert [r.summary.rows for r in part] == [60, 40]


def test_keys_verify_cannot_order_are_refused_with_what_to_do(
    stack_env: dict[str, str], schema: str
) -> None:
    dsn = stack_env["WALCAST_PG_DSN"]
    q = f'"{schema}"'
    run(dsn, f"CREATE TABLE {q}.named (name numeric PRIMARY KEY)",
        f"CREATE TABLE {q}.loose (v int)")  # fmt: skip
    src = PostgresSource(dsn)
    with pytest.raises(UnverifiableError, match=r"key column name \(numeric\)") as exc:
        list(src.ranges((schema, "named"), 10))
    assert "char(n), date, timestamp or timestamptz" in (exc.value.hint or "")
    with pytest.raises(UnverifiableError, match="no primary key or replica identity"):
        list(src.ranges((schema, "loose"), 10))
    with pytest.raises(UnverifiableError, match="no table"):
        list(src.ranges((schema, "absent"), 10))


@WORKERS
def test_text_keys_are_read_in_code_point_order_whatever_their_collation(
    stack_env: dict[str, str], schema: str, workers: int
) -> None:
    """Ranges of a text key under ICU (whose order puts "a" before "B") follow code point
    order once an index gives Postgres that order; without one the table is refused with
    the index to create."""
    dsn = stack_env["WALCAST_PG_DSN"]
    q = f'"{schema}"'
    words = [f"{p}{i}" for p in ("a", "B", "\u00e9", "Z", "\u65e5", "b ") for i in range(7)]
    run(dsn, f'CREATE TABLE {q}.icu (k text COLLATE "und-x-icu" PRIMARY KEY, v int)')
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {q}.icu VALUES (%s, 1)", [(w,) for w in words])
    src = PostgresSource(dsn, workers=workers)
    with pytest.raises(UnverifiableError, match="collation") as exc:
        list(src.ranges((schema, "icu"), 5))
    assert f'CREATE INDEX CONCURRENTLY ON {q}."icu" ("k" COLLATE "C")' in exc.value.hint
    run(dsn, f'CREATE INDEX ON {q}.icu (k COLLATE "C")')
    src = PostgresSource(dsn, workers=workers)
    ranges = list(src.ranges((schema, "icu"), 5))
    code_point = sorted(words)
    assert [r.range.upper for r in ranges[:-1]] == [(w,) for w in code_point[4::5]]
    seen = [row.key[0] for r in ranges for row in sorted(src.rows((schema, "icu"), r.range)[0],
                                                          key=lambda x: x.key)]  # fmt: skip
    assert seen == code_point


@WORKERS
def test_the_pace_bounds_rows_per_second(
    stack_env: dict[str, str], schema: str, workers: int
) -> None:
    dsn = stack_env["WALCAST_PG_DSN"]
    run(dsn, f'CREATE TABLE "{schema}".t (id int PRIMARY KEY)',
        f'INSERT INTO "{schema}".t SELECT generate_series(1, 3000)')  # fmt: skip
    started = time.monotonic()
    assert sum(r.summary.rows for r in PostgresSource(dsn, rows_per_s=5000, workers=workers).ranges(
        (schema, "t"), 500)) == 3000  # fmt: skip
    assert time.monotonic() - started >= 0.55  # 3,000 rows at 5,000/s: 0.6 s at least


def test_a_marker_asked_for_reaches_the_stream(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"vm_{unique_name}"
    h = make_harness(init=False, filters={"include": [f"{schema}.*"]},
                     snapshot={"mode": "never", "automatic": False})  # fmt: skip
    h.sql(f'CREATE SCHEMA "{schema}"')
    h.sql(f'CREATE TABLE "{schema}"."T 1" (id int PRIMARY KEY)')
    admin.init(h.settings)
    h.start()
    PostgresSource(h.dsn).mark("mark-7", [(schema, "T 1")])
    h.events(lambda evs: any(e["op"] == "verify" for e in evs), timeout=60)
    (got,) = [e for e in h.seen if e["op"] == "verify"]
    assert (got["table"], got["verify"]) == ("T 1", {"id": "mark-7"})
