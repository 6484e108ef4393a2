"""Snapshots of key ranges (V021; what a sink's ``repair`` asks for), against Postgres and
Kafka: ``_walcast.request_repair`` files a request per publication; pg2kafka reads the rows
of exactly those ranges — lower excluded, upper included, over several chunks, composite
and uuid keys too — and ends the table with a ``range_end`` marker carrying the ranges on
every partition, then reports the request done; a request for a table it cannot read by
range is refused in SQL with what is wrong, and only ``walcast_repairer`` may ask."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from services.pg2kafka import admin
from tests.integration.conftest import Harness, HarnessFactory


def reads(events: list[dict[str, Any]], table: str) -> list[Any]:
    return sorted(
        (tuple(e["key"].values()) if len(e["key"]) > 1 else next(iter(e["key"].values())))
        for e in events
        if e["op"] == "read" and e["table"] == table
    )


def range_ends(events: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    return [
        e for e in events
        if e["op"] == "snapshot" and e["table"] == table and e["snapshot"]["phase"] == "range_end"
    ]  # fmt: skip


def pipeline(make_harness: HarnessFactory, schema: str, chunk_rows: int = 3) -> Harness:
    h = make_harness(
        init=False,
        producer={"partition_key": "primary_key"},
        filters={"include": [f"{schema}.*"]},
        snapshot={"mode": "never", "automatic": False, "chunk_rows": chunk_rows},
    )
    h.sql(f'CREATE SCHEMA "{schema}"')
    return h


def progress(h: Harness, ids: list[int]) -> list[str]:
    return [str(r[2]) for r in h.sql("SELECT * FROM _walcast.repair_progress(%s)", [ids])]


def test_only_the_rows_of_the_ranges_are_read_and_their_end_marker_names_them(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"kr_{unique_name}"
    h = pipeline(make_harness, schema)
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.t (id bigint PRIMARY KEY, v text)")
    h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g FROM generate_series(1, 40) g")
    admin.init(h.settings)
    h.start()
    ranges = [[[4], [12]], [[30], None], [None, [1]]]  # (4, 12], (30, ∞), (-∞, 1]
    ids = [r[0] for r in h.sql(
        f"SELECT * FROM _walcast.request_repair('{q}.t', %s::jsonb)", [json.dumps(ranges)]
    )]  # fmt: skip
    assert len(ids) == 1
    partitions = h.settings.producer.topic_partitions
    h.events(lambda evs: len(range_ends(evs, "t")) == partitions, timeout=90)
    want = [1, *range(5, 13), *range(31, 41)]
    assert reads(h.seen, "t") == want  # each once: no row outside, none twice
    (end, *_) = range_ends(h.seen, "t")
    assert end["snapshot"]["key_ranges"] == {"columns": ["id"], "ranges": ranges}
    assert end["snapshot"]["rows"] == len(want)
    assert {h.partitions[i] for i, e in enumerate(h.seen) if e in range_ends(h.seen, "t")} == set(
        range(partitions)
    )
    # every read row precedes the end marker on its partition, and carries a version >= S
    ends = {h.partitions[i]: i for i, e in enumerate(h.seen) if e in range_ends(h.seen, "t")}
    for i, e in enumerate(h.seen):
        if e["op"] == "read":
            assert i < ends[h.partitions[i]]
            assert e["lsn"] >= end["lsn"]
    assert not [e for e in h.seen if e["op"] == "snapshot" and e["snapshot"]["phase"] == "end"]
    h.events(lambda _evs: progress(h, ids) == ["done"], timeout=60)


def test_composite_and_uuid_keys_are_read_by_their_order(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"kc_{unique_name}"
    h = pipeline(make_harness, schema, chunk_rows=4)
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.c (a int, b smallint, v text, PRIMARY KEY (a, b))")
    h.sql(f"INSERT INTO {q}.c SELECT a, b, 'x' FROM generate_series(1, 4) a,"
          " generate_series(1, 4) b")  # fmt: skip
    keys = sorted(uuid.UUID(int=n * 2**100 + n) for n in range(1, 11))
    h.sql(f"CREATE TABLE {q}.u (id uuid PRIMARY KEY)")
    h.sql(f"INSERT INTO {q}.u SELECT unnest(%s::uuid[])", [[str(k) for k in keys]])
    admin.init(h.settings)
    h.start()
    h.sql(f"SELECT _walcast.request_repair('{q}.c', %s::jsonb)",
          [json.dumps([[[2, 3], [3, 2]]])])  # fmt: skip
    h.sql(f"SELECT _walcast.request_repair('{q}.u', %s::jsonb)",
          [json.dumps([[[str(keys[2])], [str(keys[6])]]])])  # fmt: skip
    partitions = h.settings.producer.topic_partitions
    h.events(
        lambda evs: len(range_ends(evs, "c")) == len(range_ends(evs, "u")) == partitions,
        timeout=90,
    )
    assert reads(h.seen, "c") == [(2, 4), (3, 1), (3, 2)]
    assert reads(h.seen, "u") == [str(k) for k in keys[3:7]]


def test_time_and_char_keys_are_read_by_their_order_and_named_as_events_write_them(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """A date, timestamp or char(n) key's bounds: cast to the column's type whatever the
    session's time zone, read in Postgres's order (to the microsecond), and carried by
    the end marker as the events' text (what every sink compares)."""
    schema = f"kt_{unique_name}"
    h = pipeline(make_harness, schema, chunk_rows=2)
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.ev (id int, at timestamptz, PRIMARY KEY (id, at))")
    h.sql(
        f"INSERT INTO {q}.ev SELECT i, '2026-11-28 15:00:00+00'::timestamptz + u * interval"
        " '1 microsecond' FROM generate_series(1, 2) i, unnest(ARRAY[0, 1, 999, 1000,"
        " 500000, 500001, 510000]) u"
    )
    h.sql(f"CREATE TABLE {q}.d (day date PRIMARY KEY)")
    h.sql(f"INSERT INTO {q}.d SELECT '2026-01-01'::date + g FROM generate_series(0, 9) g")
    h.sql(f"CREATE TABLE {q}.c (code char(3) PRIMARY KEY)")
    h.sql(f"INSERT INTO {q}.c VALUES ('a'), ('ab'), ('abc'), ('a b'), ('b')")
    admin.init(h.settings)
    h.start()
    ev_ranges = [[[1, "2026-11-28 16:00:00.000001+01"], [2, "2026-11-28T15:00:00.0005+00:00"]]]
    h.sql(f"SELECT _walcast.request_repair('{q}.ev', %s::jsonb)", [json.dumps(ev_ranges)])
    h.sql(f"SELECT _walcast.request_repair('{q}.d', %s::jsonb)",
          [json.dumps([[["2026-01-03"], ["2026-01-06"]]])])  # fmt: skip
    h.sql(f"SELECT _walcast.request_repair('{q}.c', %s::jsonb)",
          [json.dumps([[["a"], ["ab"]], [["abc"], None]])])  # fmt: skip
    partitions = h.settings.producer.topic_partitions
    h.events(
        lambda evs: all(len(range_ends(evs, t)) == partitions for t in ("ev", "d", "c")),
        timeout=90,
    )
    assert reads(h.seen, "ev") == [
        (1, "2026-11-28T15:00:00.000999+00:00"), (1, "2026-11-28T15:00:00.001+00:00"),
        (1, "2026-11-28T15:00:00.5+00:00"), (1, "2026-11-28T15:00:00.500001+00:00"),
        (1, "2026-11-28T15:00:00.51+00:00"), (2, "2026-11-28T15:00:00+00:00"),
        (2, "2026-11-28T15:00:00.000001+00:00"),
    ]  # fmt: skip
    assert range_ends(h.seen, "ev")[0]["snapshot"]["key_ranges"]["ranges"] == [
        [[1, "2026-11-28T15:00:00.000001+00:00"], [2, "2026-11-28T15:00:00.0005+00:00"]]
    ]
    assert reads(h.seen, "d") == ["2026-01-04", "2026-01-05", "2026-01-06"]
    assert reads(h.seen, "c") == ["a b", "ab ", "b  "]  # "a" < "a b" < "ab" < "abc" < "b"
    # padded as the sinks hold char(3): "a" and "a  " are one key to Postgres, and a
    # sink's sweep of ("a", ...] would take "a  " for a key in the range
    assert range_ends(h.seen, "c")[0]["snapshot"]["key_ranges"]["ranges"] == [
        [["a  "], ["ab "]],
        [["abc"], None],
    ]


BAD = [
    ("num", [[None, [1]]], "not made of smallint, integer, bigint, uuid, text, varchar, char(n),"),
    ("chr", [[None, ["m"]]], None),  # accepted: compared blank-padded, by code point
    ("chr", [[None, ["m\u0001"]]], "without control characters"),
    ("tm", [[None, ["infinity"]]], "outside the years 1 to 9999"),
    ("tm", [[["0044-03-15 BC"], None]], "outside the years 1 to 9999"),
    ("tm", [[None, ["soon"]]], "invalid input syntax"),
    ("tm", [[["2026-01-01 10:00:00.5+02"], None]], None),  # accepted: written in UTC
    ("txt", [[None, [5]]], "is not a string of at most 8191"),
    ("txt", [[None, ["x" * 8192]]], "is not a string of at most 8191"),
    ("txt", [[["a"], ["m\u00e9"]]], None),  # accepted: compared by code point
    ("nokey", [[None, [1]]], "has no primary key"),
    ("ident", [[None, [1]]], "replica identity of"),
    ("t", [[None, [1, 2]]], "array of 1 key value"),
    ("t", [[None, ["abc"]]], "invalid input syntax"),
    ("t", [[None]], "not a [lower, upper] pair"),
    ("t", [], "1 to 10000"),
    ("t", {"a": 1}, "1 to 10000"),
    ("t", [[[5], [5]], [None, None]], None),  # accepted: an empty range reads nothing
    ("hidden", [[None, [1]]], "is in no publication"),
]


def test_a_request_the_stream_cannot_serve_is_refused_with_what_is_wrong(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"kx_{unique_name}"
    h = pipeline(make_harness, schema)
    q = f'"{schema}"'
    try:
        h.sql(f"CREATE TABLE {q}.t (id int PRIMARY KEY)")
        h.sql(f"CREATE TABLE {q}.txt (id text PRIMARY KEY)")
        h.sql(f"CREATE TABLE {q}.chr (id char(4) PRIMARY KEY)")
        h.sql(f"CREATE TABLE {q}.num (id numeric PRIMARY KEY)")
        h.sql(f"CREATE TABLE {q}.tm (at timestamptz PRIMARY KEY)")
        h.sql(f"CREATE TABLE {q}.nokey (id int)")
        h.sql(f"CREATE TABLE {q}.ident (id int PRIMARY KEY, u int NOT NULL UNIQUE)")
        h.sql(f"ALTER TABLE {q}.ident REPLICA IDENTITY USING INDEX ident_u_key")
        h.sql(f"CREATE TABLE {q}.hidden (id int PRIMARY KEY)")
        admin.init(h.settings)
        h.sql(f"ALTER PUBLICATION {h.settings.replication.publication} DROP TABLE {q}.hidden")
        for table, ranges, reason in BAD:
            call = f"SELECT * FROM _walcast.request_repair('{q}.{table}', %s::jsonb)"
            if reason is None:
                # one request per publication holding the table: this pg2kafka's, and any
                # FOR ALL TABLES publication of a test running beside this one
                ids = [r[0] for r in h.sql(call, [json.dumps(ranges)])]
                assert h.sql(
                    "SELECT count(*) FROM _walcast.snapshot_requests"
                    " WHERE id = ANY(%s) AND publication = %s",
                    [ids, h.settings.replication.publication],
                ) == [(1,)], ids
                continue
            with pytest.raises(psycopg.Error) as err:
                h.sql(call, [json.dumps(ranges)])
            assert reason in str(err.value), (table, ranges)
        assert h.sql(
            "SELECT count(*) FROM _walcast.snapshot_requests WHERE schema_name = %s"
            " AND publication = %s",
            [schema, h.settings.replication.publication],
        ) == [(sum(reason is None for *_, reason in BAD),)]  # the accepted ones alone
    finally:
        h.sql(f"DROP SCHEMA {q} CASCADE")  # keyless tables would linger in init's warnings


def test_only_walcast_repairer_may_ask_and_the_functions_run_as_their_owner(
    make_harness: HarnessFactory,
) -> None:
    h = make_harness()  # init applied the migrations
    for fn in ("_walcast.request_repair(regclass, jsonb)", "_walcast.repair_progress(bigint[])"):
        rows = h.sql(
            f"SELECT has_function_privilege('walcast_repairer', '{fn}', 'EXECUTE'),"
            " EXISTS (SELECT 1 FROM pg_proc p, aclexplode(p.proacl) a"
            f"  WHERE p.oid = '{fn}'::regprocedure AND a.grantee = 0"
            "  AND a.privilege_type = 'EXECUTE'),"
            f" (SELECT prosecdef FROM pg_proc WHERE oid = '{fn}'::regprocedure)"
        )
        assert rows == [(True, False, True)], fn
    rows = h.sql(
        "SELECT has_function_privilege('walcast_repairer',"
        " '_walcast.checked_key_ranges(regclass, jsonb)', 'EXECUTE'),"
        " has_function_privilege('walcast_verifier', '_walcast.request_repair(regclass, jsonb)',"
        " 'EXECUTE'),"
        " has_function_privilege('walcast_repairer', '_walcast.key_time_text(text, oid, text)',"
        " 'EXECUTE'),"
        " EXISTS (SELECT 1 FROM pg_proc p, aclexplode(p.proacl) a"
        "  WHERE p.oid = '_walcast.key_time_text(text, oid, text)'::regprocedure"
        "  AND a.grantee = 0)"
    )
    assert rows == [(False, False, False, False)]
