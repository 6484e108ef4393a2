"""DDL travels in the stream before dependent data; filters shape the publication."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import jsonschema
import orjson
import psycopg
import pytest

from services.pg2kafka import admin
from shared.migrations import available
from tests.integration.conftest import Harness, HarnessFactory, data

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[3] / "shared/schemas/change_event.v1.json").read_text()
)


def test_ddl_reaches_kafka_before_dependent_data(harness: Harness, unique_name: str) -> None:
    t = f"{unique_name}_ddl"
    harness.start()
    harness.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, a text NOT NULL)")
    harness.sql(f"INSERT INTO {t} VALUES (1, 'one')")
    harness.sql(f"ALTER TABLE {t} ADD COLUMN b numeric(8,2)")
    harness.sql(f"INSERT INTO {t} VALUES (2, 'two', 2.5)")
    harness.sql(f"ALTER TABLE {t} RENAME COLUMN a TO a2")
    harness.sql(f"UPDATE {t} SET a2 = 'uno' WHERE id = 1")
    harness.sql(f"ALTER TABLE {t} DROP COLUMN b")
    harness.sql(f"INSERT INTO {t} VALUES (3, 'three')")
    harness.sql(f"DROP TABLE {t}")
    harness.events(lambda s: len([e for e in s if e.get("table") == t]) >= 9)
    evs = [e for e in harness.seen if e.get("table") == t]  # DDL included
    for ev in evs:
        jsonschema.validate(ev, SCHEMA)
    ops = [e["op"] for e in evs]
    assert ops == ["ddl", "insert", "ddl", "insert", "ddl", "update", "ddl", "insert", "ddl"]
    cols = [
        [c["name"] for c in e["ddl"]["columns"]]
        for e in evs
        if e["op"] == "ddl" and "columns" in e["ddl"]
    ]
    assert cols == [["id", "a"], ["id", "a", "b"], ["id", "a2", "b"], ["id", "a2"]]
    create = evs[0]["ddl"]
    assert create["tag"] == "CREATE TABLE"
    assert create["primary_key"] == ["id"]
    assert create["columns"][1] == {
        "name": "a",
        "type": "text",
        "sql_type": "text",
        "nullable": False,
        "num": 2,
    }
    assert evs[2]["ddl"]["columns"][2]["sql_type"] == "numeric(8,2)"
    # a rename keeps the column's number: that, not the statement, identifies it
    assert [c["num"] for c in evs[4]["ddl"]["columns"]] == [1, 2, 3]
    assert "RENAME COLUMN" in evs[4]["ddl"]["statement"]
    assert evs[5]["new"] == {"id": 1, "a2": "uno", "b": None}
    assert evs[-1]["ddl"]["tag"] == "DROP TABLE"
    assert evs[-1]["ddl"]["dropped"] is True
    lsns = [e["lsn"] for e in evs]
    assert lsns == sorted(lsns)


def test_filters_shape_the_publication_and_follow_new_tables(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    app = f"{unique_name}_app"
    h = make_harness(
        init=False,
        filters={"include": [f"{app}.*", f"*.{unique_name}_orders"],
                 "exclude": [f"{app}.secret*"]},
    )  # fmt: skip
    settings = h.settings
    h.sql(f"CREATE SCHEMA {app}")
    h.sql(f"CREATE TABLE {app}.t1 (id int PRIMARY KEY)")
    h.sql(f"CREATE TABLE {app}.secret_stuff (id int PRIMARY KEY)")
    h.sql(f"CREATE TABLE {unique_name}_orders (id int PRIMARY KEY)")
    h.sql(f"CREATE TABLE {unique_name}_other (id int PRIMARY KEY)")
    try:
        admin.init(settings)
        tables = admin.status(settings)["publication_tables"]
        assert sorted(tables) == sorted([f"{app}.t1", f"public.{unique_name}_orders"])
        h.start()
        h.sql(f"CREATE TABLE {app}.t2 (id int PRIMARY KEY)")  # matches: joins the publication
        h.sql(f"CREATE TABLE {app}.secret_more (id int PRIMARY KEY)")  # excluded
        for table in (
            f"{app}.t1",
            f"{app}.t2",
            f"{app}.secret_stuff",
            f"{app}.secret_more",
            f"{unique_name}_orders",
            f"{unique_name}_other",
        ):
            h.sql(f"INSERT INTO {table} VALUES (1)")
        h.sql(f"INSERT INTO {unique_name}_orders VALUES (2)")  # a marker: the last change
        h.events(
            lambda s: (
                len(data(s, f"{unique_name}_orders")) >= 2
                and any(e.get("table") == "t2" and e["op"] == "insert" for e in s)
            )
        )
        mine = [
            (e["op"], e["table"])
            for e in h.seen
            if e.get("schema") == app or str(e.get("table", "")).startswith(unique_name)
        ]
        assert sorted(set(mine)) == sorted(
            {("insert", "t1"), ("ddl", "t2"), ("insert", "t2"), ("insert", f"{unique_name}_orders")}
        )
        assert f"{app}.t2" in admin.status(settings)["publication_tables"]
        assert f"{app}.secret_more" not in admin.status(settings)["publication_tables"]
    finally:
        h.stop()
        h.sql(f"DROP SCHEMA {app} CASCADE")


def test_ddl_goes_to_every_partition_under_primary_key_keys(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    h = make_harness(producer={"partition_key": "primary_key"})
    t = f"{unique_name}_pkddl"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    h.start()
    h.sql(f"ALTER TABLE {t} ADD COLUMN note text")
    h.sql(f"INSERT INTO {t} SELECT g, 'n' FROM generate_series(1, 20) g")
    h.events(lambda s: len([e for e in s if e.get("table") == t]) >= 26)
    # both schema changes (the CREATE, after init, and the ALTER) reach every partition
    for tag in ("CREATE TABLE", "ALTER TABLE"):
        parts = sorted(
            p
            for p, e in zip(h.partitions, h.seen, strict=True)
            if e.get("table") == t and e["op"] == "ddl" and e["ddl"]["tag"] == tag
        )
        assert parts == [0, 1, 2], tag
    # in every partition, the schema change precedes that partition's rows
    for part in range(3):
        ops = [
            e["op"]
            for p, e in zip(h.partitions, h.seen, strict=True)
            if p == part and e.get("table") == t
        ]
        assert ops[0] == "ddl", (part, ops)


def test_truncate_goes_to_every_partition_under_primary_key_keys(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """pgbench -i's TRUNCATE + COPY in one transaction: the rows after the truncate spread
    over every partition, so each partition must carry the truncate before them (sent to
    one partition, a consumer reading the others first deleted newer rows)."""
    h = make_harness(producer={"partition_key": "primary_key"})
    t = f"{unique_name}_pktrunc"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    h.start()
    h.sql(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 30) g")
    h.sql(f"BEGIN; TRUNCATE {t}; INSERT INTO {t} SELECT g, 1 FROM generate_series(1, 30) g; COMMIT")
    h.events(lambda s: len([e for e in s if e.get("table") == t and e["op"] == "insert"]) >= 60)
    mine = [(p, e) for p, e in zip(h.partitions, h.seen, strict=True) if e.get("table") == t]
    truncates = [(p, e) for p, e in mine if e["op"] == "truncate"]
    assert sorted(p for p, _ in truncates) == [0, 1, 2]
    assert len({(e["lsn"], e["seq"]) for _, e in truncates}) == 1  # one truncate, three copies
    cut = truncates[0][1]["lsn"]
    for part in range(3):
        ops = [(e["op"], e["lsn"]) for p, e in mine if p == part]
        at = ops.index(("truncate", cut))
        assert all(lsn < cut for op, lsn in ops[:at] if op == "insert"), (part, ops)
        assert all(lsn > cut for op, lsn in ops[at + 1 :]), (part, ops)
        assert any(op == "insert" for op, _ in ops[at + 1 :]), (part, ops)


def test_partitioned_table_streams_under_its_root(harness: Harness, unique_name: str) -> None:
    t = f"{unique_name}_parted"
    harness.start()
    harness.sql(
        f"CREATE TABLE {t} (id int, day date, PRIMARY KEY (id, day)) PARTITION BY RANGE (day)"
    )
    harness.sql(
        f"CREATE TABLE {t}_d1 PARTITION OF {t} FOR VALUES FROM ('2026-01-01') TO ('2026-01-02')"
    )
    harness.sql(f"INSERT INTO {t} VALUES (1, '2026-01-01')")
    harness.events(lambda s: len(data(s, t)) >= 1)
    mine = [(e["op"], e["table"]) for e in harness.seen if str(e.get("table", "")).startswith(t)]
    assert mine == [("ddl", t), ("insert", t)]  # no event names the partition


def test_migrations_are_versioned_and_applied_once(harness: Harness) -> None:
    rows = harness.sql(
        "SELECT version, name FROM _walcast.schema_migrations"
        " WHERE component = 'pg2kafka' ORDER BY version"
    )
    assert rows == [(m.version, m.name) for m in available("pg2kafka")]
    assert rows[:3] == [(1, "ddl_capture"), (2, "ddl_skips_partitions"), (3, "subscriptions")]
    report = admin.init(harness.settings, migrations_only=True)
    assert report.created == []  # nothing applied twice


def test_ddl_messages_cannot_be_forged_and_malformed_ones_are_skipped(
    harness: Harness, unique_name: str
) -> None:
    role = f"{unique_name}_app"
    harness.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")
    try:
        dsn = harness.dsn.replace("walcast:walcast@", f"{role}:pw-{role}@")
        with (
            psycopg.connect(dsn, autocommit=True) as c,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            c.execute("SELECT pg_logical_emit_message(true, 'walcast.ddl', '{}')")
    finally:
        harness.sql(f"DROP ROLE {role}")
    t = f"{unique_name}_after"
    harness.sql(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    harness.start()
    # a privileged mistake must not stop the stream either
    harness.sql("SELECT pg_logical_emit_message(true, 'walcast.ddl', 'not json')")
    harness.sql("SELECT pg_logical_emit_message(true, 'walcast.ddl', '{\"tables\": [null]}')")
    harness.sql(f"INSERT INTO {t} VALUES (1)")
    harness.events(lambda s: len(data(s, t)) >= 1)


def test_temporary_and_unlogged_tables_never_break_application_ddl(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    # every schema (a temporary table's too), the test's own tables (tests/conftest.py)
    h = make_harness(filters={"exclude": [f"{unique_name}_x.*"]})
    with psycopg.connect(h.dsn, autocommit=True) as c:
        c.execute(f"CREATE TEMP TABLE {unique_name}_tmp (id int)")
        c.execute(f"CREATE UNLOGGED TABLE {unique_name}_unlogged (id int PRIMARY KEY)")
        c.execute(f"CREATE TABLE {unique_name}_real (id int PRIMARY KEY)")
        c.execute(f"DROP TABLE {unique_name}_unlogged")
    tables = admin.status(h.settings)["publication_tables"]
    assert f"public.{unique_name}_real" in tables
    assert not [t for t in tables if t.endswith(("_tmp", "_unlogged"))]


@pytest.mark.parametrize("scrub", [True, False])
def test_a_password_sent_with_ddl_is_scrubbed_from_the_event(
    make_harness: HarnessFactory, unique_name: str, scrub: bool
) -> None:
    """current_query() is everything the client sent at once: the ALTER TABLE's event would
    carry the ALTER ROLE ... PASSWORD sent with it. ddl.scrub_secrets (on by default)
    masks the literal; off, the statement travels verbatim."""
    t = f"{unique_name}_t"
    role = f"{unique_name}_role"
    secret = f"pw-{uuid.uuid4().hex}"
    h = make_harness(ddl={"scrub_secrets": scrub})
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    h.sql(f"CREATE ROLE {role} NOLOGIN")
    try:
        h.start()
        # One simple-protocol query holding both statements (no parameters: psycopg
        # sends it as is); so do the dollar-quoted and OPTIONS-style spellings.
        h.sql(
            f"ALTER TABLE {t} ADD COLUMN c int; ALTER ROLE {role} PASSWORD '{secret}';"
            f" ALTER ROLE {role} PASSWORD $pw${secret}-2$pw$"
        )
        h.sql(f"INSERT INTO {t} VALUES (1, 1)")
        h.events(lambda s: len(data(s, t)) >= 1)
        (ev,) = [e for e in h.seen if e.get("table") == t and e["op"] == "ddl" and
                 "c" in [c["name"] for c in e["ddl"].get("columns", [])]]  # fmt: skip
        statement = ev["ddl"]["statement"]
        assert f"ALTER TABLE {t} ADD COLUMN c int" in statement
        if scrub:
            assert secret not in orjson.dumps(ev).decode()
            assert statement.count("PASSWORD '***'") == 2
        else:
            assert f"PASSWORD '{secret}'" in statement
    finally:
        h.stop()
        h.sql(f"DROP TABLE IF EXISTS {t}")
        h.sql(f"DROP ROLE IF EXISTS {role}")
