"""The row hash (shared/contract/rowhash.py) that pg2kafka puts on each insert, update and
read row equals the one Postgres computes in SQL for the same row — on the stream's path
(pgoutput's text, the compiled hasher), the snapshot's built path (COPY's text) and its
fast path (the hash written by Postgres itself), over types whose text output differs from
their cast to text (boolean, char(n), inet), arrays, json kept byte for byte, money,
floats, intervals, bytea, dates BC, an enum, a domain, a range, a composite. An update that
leaves an unchanged TOAST value out carries no hash; the next full row carries it again.
"""

from __future__ import annotations

import random

import psycopg
from psycopg import sql

from services.pg2kafka import admin
from services.pg2kafka.replication import SESSION_OPTIONS
from shared.contract.rowhash import row_hash_sql, text_hash
from tests.integration.conftest import HarnessFactory

TYPES_COLUMNS = """
    id int PRIMARY KEY, b bool, ch char(6), vc varchar(20), t text, i2 int2, i8 int8,
    n numeric, f4 real, f8 float8, ts timestamp, tz timestamptz, d date, tm time,
    iv interval, by bytea, js json, jb jsonb, ia int[], ta text[], ip inet, m money,
    u uuid, e {enum}, dm {domain}, r int4range, c {composite}, big text
"""
TYPES_ROW = """(
    %s, true, 'ab', 'x y', 'say "hi", \\ back', -3, 9007199254740993,
    'NaN', 1.5, 0.1, '2024-02-29 13:14:15.5', '2024-02-29 13:14:15.5+02', '0044-03-15 BC',
    '23:59:59.999999', '1 year 2 mons -3 days 04:05:06.7', '\\x00ff10',
    '{"b": 1,   "a": [1, 2.50]}', '{"b": 1, "a": [1, 2.50]}', '{1,NULL,3}',
    '{"a b",NULL,"c\\"d",""}', '10.0.0.1', 12.34, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
    'sad', 7, '[1,5)', '(1,"x y")', NULL
)"""


def sql_hashes(dsn: str, schema: str, table: str) -> dict[int, int]:
    """Each row's hash as Postgres computes it: the SQL of the contract over the
    stream's columns (not dropped, not generated), in a session pinned like pg2kafka's."""
    with psycopg.connect(dsn, autocommit=True, options=SESSION_OPTIONS) as conn:
        cols = [
            str(r[0])
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                [f'"{schema}"."{table}"'],
            )
        ]
        rows = conn.execute(
            sql.SQL("SELECT id, {} FROM {}").format(
                row_hash_sql(cols), sql.Identifier(schema, table)
            )
        ).fetchall()
    return {int(k): int(h) for k, h in rows}


def newest(events: list[dict], table: str) -> dict[int, dict]:
    """The newest insert / update / read event per key of ``table``."""
    out: dict[int, dict] = {}
    for e in events:
        if e.get("table") == table and e["op"] in ("insert", "update", "read"):
            k = e["key"]["id"]
            if k not in out or e["lsn"] >= out[k]["lsn"]:
                out[k] = e
    return out


def test_every_path_hashes_rows_as_postgres_does(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"rh_{unique_name}"
    h = make_harness(
        init=False, snapshot={"mode": "initial", "workers": 1}, filters={"include": [f"{schema}.*"]}
    )
    q = f'"{schema}"'
    h.sql(f"CREATE SCHEMA {q}")
    h.sql(f"CREATE TYPE {q}.mood AS ENUM ('sad', 'ok')")
    h.sql(f"CREATE DOMAIN {q}.pos AS int CHECK (VALUE > 0)")
    h.sql(f"CREATE TYPE {q}.pair AS (a int, b text)")
    cols = TYPES_COLUMNS.format(enum=f"{q}.mood", domain=f"{q}.pos", composite=f"{q}.pair")
    h.sql(f"CREATE TABLE {q}.typed ({cols})")
    # Only types Postgres writes as JSON itself: the snapshot's fast path.
    h.sql(f"CREATE TABLE {q}.plain (id int PRIMARY KEY, b bool, ch char(4), t text,"
          f" u uuid, n int8)")  # fmt: skip
    for i in range(1, 6):
        h.sql(f"INSERT INTO {q}.typed VALUES {TYPES_ROW}", [i])
        h.sql(f"INSERT INTO {q}.plain VALUES (%s, %s, 'x', %s, gen_random_uuid(), NULL)",
              [i, i % 2 == 0, "é" * i])  # fmt: skip
    h.sql(f"UPDATE {q}.typed SET b = NULL, ch = NULL WHERE id = 2")
    h.sql(
        f"UPDATE {q}.typed SET big = (SELECT string_agg(md5(random()::text), '')"
        f" FROM generate_series(1, 400)) WHERE id IN (3, 4)"
    )
    admin.init(h.settings)
    h.start()
    tables = ("typed", "plain")
    h.events(lambda evs: all(len(newest(evs, t)) == 5 for t in tables), timeout=120)
    assert all(e["op"] == "read" for t in tables for e in newest(h.seen, t).values())
    # The stream: inserts, updates, a key change, a row whose TOAST value stays out.
    h.sql(f"INSERT INTO {q}.typed VALUES {TYPES_ROW}", [6])
    h.sql(f"UPDATE {q}.typed SET t = 'changed', ip = '::1' WHERE id = 1")
    h.sql(f"UPDATE {q}.typed SET id = 7 WHERE id = 5")
    h.sql(f"UPDATE {q}.typed SET n = 1 WHERE id = 3")  # big unchanged: left out
    h.sql(f"UPDATE {q}.plain SET t = NULL WHERE id = 1")
    h.sql(f"INSERT INTO {q}.plain VALUES (9, NULL, NULL, NULL, NULL, NULL)")

    def streamed(evs: list[dict]) -> bool:
        typed, plain = newest(evs, "typed"), newest(evs, "plain")
        return 6 in typed and 7 in typed and typed[3]["op"] == "update" and 9 in plain

    h.events(streamed, timeout=60)
    h.sql(f"INSERT INTO {q}.plain VALUES (10, true, 'z', 'end', NULL, 1)")
    h.events(lambda evs: 10 in newest(evs, "plain"), timeout=60)

    for table in tables:
        want = sql_hashes(h.dsn, schema, table)
        got = newest(h.seen, table)
        assert set(got) >= set(want), (table, sorted(want), sorted(got))
        for key, expected in want.items():
            ev = got[key]
            if ev.get("unchanged_toast"):
                assert "hash" not in ev, ev  # the row's text is not all here
                continue
            assert ev.get("hash") == expected, (table, key, ev["op"], ev.get("hash"), expected)
    toasted = newest(h.seen, "typed")[3]
    assert toasted["unchanged_toast"] == ["big"]
    assert "hash" not in toasted
    ops = {e["op"] for e in h.seen if e.get("table") in tables and "hash" in e}
    assert ops == {"read", "insert", "update"}


def test_the_contracts_text_hash_is_the_servers_hashtext(stack_env: dict[str, str]) -> None:
    """Every length of tail (0..11 bytes after whole 12-byte blocks), multi-byte UTF-8."""
    rnd = random.Random(11)
    texts = ["".join(rnd.choice("ab:é€😀\\\"'\n0") for _ in range(n)) for n in range(60)]
    texts += ["x" * 1000, "é" * 333]
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as conn:
        got = conn.execute(
            "SELECT hashtext(t)::bigint & 4294967295 FROM unnest(%s::text[]) WITH ORDINALITY"
            " AS u(t, n) ORDER BY n",
            [texts],
        ).fetchall()
    assert [int(r[0]) for r in got] == [text_hash(t.encode()) for t in texts]
