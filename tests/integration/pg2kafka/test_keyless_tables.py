"""Tables without a replica identity never make the application's statements fail,
and under filters.keyless_tables=inserts (the default, V017) their inserts and truncates
stream as append-only rows.

Before V008, ``init`` created a ``FOR ALL TABLES`` publication, after which Postgres
refused every UPDATE and DELETE on a table without a primary key ("cannot update table
... because it does not have a replica identity and publishes updates")."""

from __future__ import annotations

import time
from typing import Any

import orjson
import psycopg
import pytest

from services.pg2kafka import admin
from services.pg2kafka.settings import inserts_publication
from shared.contract.event import decode
from shared.errors import PermanentError
from tests.integration.conftest import Harness, HarnessFactory, data


def published(h: Harness, publication: str | None = None) -> set[str]:
    rows = h.sql(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
        [publication or h.settings.replication.publication],
    )
    return {r[0] for r in rows}


def insert_only(h: Harness) -> set[str]:
    return published(h, inserts_publication(h.settings.replication.publication))


def publication_exists(h: Harness, name: str) -> bool:
    return bool(h.sql("SELECT 1 FROM pg_publication WHERE pubname = %s", [name]))


def test_keyless_tables_are_left_out_and_join_when_they_gain_a_key(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """filters.keyless_tables=skip (the default before V017)."""
    keyless, keyed = f"{unique_name}_nokey", f"{unique_name}_key"
    h = make_harness(init=False, filters={"keyless_tables": "skip"})
    h.sql(f"CREATE TABLE {keyless} (a int, b text)")
    h.sql(f"CREATE TABLE {keyed} (id int PRIMARY KEY, v int)")
    h.sql(f"INSERT INTO {keyless} VALUES (1, 'x')")
    h.sql(f"INSERT INTO {keyed} VALUES (1, 1)")
    report = admin.init(h.settings)
    assert any(keyless in w for w in report.warnings), report.warnings
    # the application's statements on the keyless table still work
    h.sql(f"UPDATE {keyless} SET b = 'y'")
    h.sql(f"DELETE FROM {keyless} WHERE a = 2")
    assert keyless not in published(h)
    assert keyed in published(h)
    assert not publication_exists(h, inserts_publication(h.settings.replication.publication))
    h.start()
    assert h.service is not None
    gauge = h.service.cdc.metrics.keyless_tables
    h.sql(f"UPDATE {keyed} SET v = 2")
    h.events(lambda s: len(data(s, keyed)) >= 1)
    assert gauge._value.get() >= 1
    # gaining a key: the table joins the publication in the same transaction
    h.sql(f"ALTER TABLE {keyless} ADD PRIMARY KEY (a)")
    assert keyless in published(h)
    h.sql(f"UPDATE {keyless} SET b = 'z' WHERE a = 1")
    h.events(lambda s: len(data(s, keyless)) >= 1)
    assert data(h.seen, keyless)[-1]["new"] == {"a": 1, "b": "z"}
    # losing it: the table leaves, and the application's UPDATE still works
    h.sql(f"ALTER TABLE {keyed} DROP CONSTRAINT {keyed}_pkey")
    assert keyed not in published(h)
    h.sql(f"UPDATE {keyed} SET v = 3")
    h.sql(f"DELETE FROM {keyed}")
    h.sql(f"DROP TABLE {keyless}, {keyed}")


def test_full_identity_when_asked(make_harness: HarnessFactory, unique_name: str) -> None:
    # Its own schema, and a filter to match: full_identity changes every keyless table the
    # filter lets through (with the default filter, every other test's too).
    schema = f"fi_{unique_name[-12:]}"
    t = f"{schema}.{unique_name}_full"
    h = make_harness(
        init=False, filters={"keyless_tables": "full_identity", "include": [f"{schema}.*"]}
    )
    h.sql(f"CREATE SCHEMA {schema}")
    h.sql(f"CREATE TABLE {t} (a int, b text)")
    report = admin.init(h.settings)
    assert f"REPLICA IDENTITY FULL on {t}" in report.created
    assert t.split(".")[1] in published(h)
    later = f"{t}_later"
    h.sql(f"CREATE TABLE {later} (a int)")  # created after init: same rule
    assert h.sql("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", [later]) == [("f",)]
    assert later.split(".")[1] in published(h)
    h.start()
    h.sql(f"INSERT INTO {t} VALUES (1, 'x')")
    h.sql(f"UPDATE {t} SET b = 'y'")
    name = t.split(".")[1]
    h.events(lambda s: len(data(s, name)) >= 3)
    # Without a primary key, FULL identity makes every column the key: the update moved
    # the row to another key, so it travels as a delete of the old row and an insert.
    gone, moved = data(h.seen, name)[-2:]
    assert (gone["op"], gone["old"]) == ("delete", {"a": 1, "b": "x"})  # the whole old row
    assert (moved["op"], moved["new"]) == ("insert", {"a": 1, "b": "y"})
    h.sql(f"DROP SCHEMA {schema} CASCADE")


def test_a_for_all_tables_publication_is_converted(
    make_harness: HarnessFactory, unique_name: str, stack_env: dict[str, str]
) -> None:
    """What an earlier init created: init converts it, and the keyless table's updates
    work again."""
    t = f"{unique_name}_legacy"
    h = make_harness(init=False)
    pub = h.settings.replication.publication
    h.sql(f"CREATE TABLE {t} (a int)")
    admin.init(h.settings, migrations_only=True)
    h.sql(f'CREATE PUBLICATION "{pub}" FOR ALL TABLES')
    with (
        psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as c,
        pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState),
    ):
        c.execute(f"UPDATE {t} SET a = 1")  # the failure the application saw
    report = admin.init(h.settings)
    assert any("converted from FOR ALL TABLES" in w for w in report.warnings)
    h.sql(f"UPDATE {t} SET a = 1")
    assert h.sql("SELECT puballtables FROM pg_publication WHERE pubname = %s", [pub]) == [(False,)]
    h.sql(f"DROP TABLE {t}")


def tear_down_when_idle(h: Harness) -> list[str]:
    """``pg2kafka tear-down`` once the stopped pg2kafka's walsender has gone."""
    deadline = time.monotonic() + 30
    while h.sql(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active",
        [h.settings.replication.slot],
    ):
        assert time.monotonic() < deadline, "the slot stayed active 30 s after the stop"
        time.sleep(0.2)
    return admin.tear_down(h.settings)


def reads(events: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    return [e for e in data(events, table) if e["op"] == "read"]


def test_a_keyless_table_streams_its_inserts_and_truncates_by_default(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """Default filters.keyless_tables=inserts: the initial snapshot brings the rows as
    append-only reads in ctid order; inserts stream flagged, truncates stream; the
    application's UPDATE and DELETE work and are not streamed; tear-down drops both
    publications."""
    schema = unique_name
    h = make_harness(
        init=False,
        snapshot={"mode": "initial", "workers": 2, "chunk_pages": 2},
        filters={"include": [f"{schema}.*"]},
    )
    pub = h.settings.replication.publication
    ins = inserts_publication(pub)
    h.sql(f"CREATE SCHEMA {schema}")
    h.sql(f"CREATE TABLE {schema}.log (n int, pad text)")
    h.sql(f"CREATE TABLE {schema}.k (id int PRIMARY KEY, v int)")
    h.sql(f"INSERT INTO {schema}.log SELECT g, repeat('x', 200) FROM generate_series(1, 300) g")
    # Holes refilled by later rows: physical order is not insertion order.
    h.sql(f"DELETE FROM {schema}.log WHERE n % 7 = 0")
    h.sql(f"VACUUM {schema}.log")
    h.sql(f"INSERT INTO {schema}.log SELECT g, repeat('y', 200) FROM generate_series(301, 340) g")
    h.sql(f"INSERT INTO {schema}.k VALUES (1, 1)")
    report = admin.init(h.settings)
    assert f"publication {ins} (insert-only: tables without a key)" in report.created
    assert not any("log" in w for w in report.warnings), report.warnings
    assert published(h) == {"k"}
    assert insert_only(h) == {"log"}
    in_ctid_order = [r[0] for r in h.sql(f"SELECT n FROM {schema}.log ORDER BY ctid")]

    h.start()
    h.events(lambda s: any(e["op"] == "snapshot" and e["table"] == "log"
                           and e["snapshot"]["phase"] == "end" for e in s))  # fmt: skip
    rows = reads(h.seen, "log")
    assert len(rows) == len(in_ctid_order)
    assert all(e["append_only"] is True and e["key"] == {} for e in rows)
    chunks = {e["snapshot"]["chunk"] for e in rows}
    assert len(chunks) > 2  # several chunks, read by two readers
    # Each chunk in ctid order, numbered from 0: a chunk read again numbers them alike.
    ordered = sorted(rows, key=lambda e: (e["snapshot"]["chunk"], e["seq"]))
    assert [e["new"]["n"] for e in ordered] == in_ctid_order
    for chunk in chunks:
        seqs = sorted(e["seq"] for e in rows if e["snapshot"]["chunk"] == chunk)
        assert seqs == list(range(len(seqs)))
    ids = {decode(orjson.dumps(e)).row_id() for e in rows}
    assert len(ids) == len(rows)
    assert all(e.get("append_only") is None for e in reads(h.seen, "k"))

    # The application's statements all work; only inserts and truncates stream.
    h.sql(f"INSERT INTO {schema}.log VALUES (1001, 'a'), (1002, 'b')")
    h.sql(f"UPDATE {schema}.log SET pad = 'changed' WHERE n = 1001")
    h.sql(f"DELETE FROM {schema}.log WHERE n = 1002")
    h.sql(f"UPDATE {schema}.k SET v = 2")
    h.sql(f"TRUNCATE {schema}.log")
    h.sql(f"INSERT INTO {schema}.log VALUES (1003, 'c')")
    h.events(lambda s: any(e["op"] == "insert" and e["table"] == "log"
                           and e["new"]["n"] == 1003 for e in s))  # fmt: skip
    h.events(lambda s: any(e["op"] == "update" and e["table"] == "k" for e in s))
    changes = [e for e in data(h.seen, "log") if e["op"] not in ("read", "snapshot")]
    assert [(e["op"], (e.get("new") or {}).get("n")) for e in changes] == [
        ("insert", 1001), ("insert", 1002), ("truncate", None), ("insert", 1003),
    ]  # fmt: skip
    assert all(e["append_only"] is True for e in changes if e["op"] == "insert")
    assert changes[0]["key"] == {}
    assert changes[0]["new"]["pad"] == "a"
    (update,) = [e for e in data(h.seen, "k") if e["op"] == "update"]
    assert update["key"] == {"id": 1}
    assert "append_only" not in update
    assert h.service is not None
    assert h.service.cdc.metrics.keyless_tables._value.get() == 0  # none left out

    h.stop()
    removed = tear_down_when_idle(h)
    assert f"publication {pub}" in removed
    assert f"publication {ins}" in removed
    assert not publication_exists(h, pub)
    assert not publication_exists(h, ins)
    h.sql(f"DROP SCHEMA {schema} CASCADE")


def test_a_keyless_table_that_gains_a_key_moves_and_is_snapshotted(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """Gaining a key moves the table to the main publication in the DDL's transaction and
    the automatic incremental snapshot brings its rows keyed; losing it moves the table
    back. An incremental snapshot of a keyless table is refused with the reason."""
    t = f"{unique_name}_grow"
    h = make_harness(init=False, snapshot={"mode": "never", "automatic": True})
    h.sql(f"CREATE TABLE {t} (a int NOT NULL, b text)")
    h.sql(f"INSERT INTO {t} VALUES (1, 'old'), (2, 'old')")
    admin.init(h.settings)
    assert t in insert_only(h)
    assert t not in published(h)
    with pytest.raises(PermanentError, match="insert-only table"):
        admin.snapshot_request(h.settings, [t])
    h.start()
    h.sql(f"INSERT INTO {t} VALUES (3, 'new')")
    h.events(lambda s: len(data(s, t)) >= 1)
    (first,) = data(h.seen, t)
    assert (first["op"], first["append_only"]) == ("insert", True)
    assert first["new"] == {"a": 3, "b": "new"}

    h.sql(f"ALTER TABLE {t} ADD PRIMARY KEY (a)")
    assert t in published(h)
    assert t not in insert_only(h)
    h.events(lambda s: {e["new"]["a"] for e in reads(s, t)} >= {1, 2, 3})
    snapshot_rows = reads(h.seen, t)
    assert all(e["key"] == {"a": e["new"]["a"]} for e in snapshot_rows)
    assert all("append_only" not in e for e in snapshot_rows)
    h.sql(f"UPDATE {t} SET b = 'keyed' WHERE a = 2")
    h.events(lambda s: any(e["op"] == "update" and e["table"] == t for e in s))
    (update,) = [e for e in data(h.seen, t) if e["op"] == "update"]
    assert (update["key"], update["new"]) == ({"a": 2}, {"a": 2, "b": "keyed"})

    h.sql(f"ALTER TABLE {t} DROP CONSTRAINT {t}_pkey")
    assert t in insert_only(h)
    assert t not in published(h)
    h.sql(f"UPDATE {t} SET b = 'unkeyed'")  # the application's statement works
    h.sql(f"INSERT INTO {t} VALUES (4, 'again')")
    h.events(lambda s: any(e["op"] == "insert" and e["table"] == t and e["new"]["a"] == 4
                           for e in s))  # fmt: skip
    last = data(h.seen, t)[-1]
    assert (last["op"], last["append_only"]) == ("insert", True)
    assert [e for e in data(h.seen, t) if e["op"] == "update"] == [update]
    h.stop()
    h.sql(f"DROP TABLE {t}")


def test_switching_to_skip_empties_the_insert_only_publication(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    t = f"{unique_name}_sw"
    h = make_harness(init=False, snapshot={"mode": "never"})
    h.sql(f"CREATE TABLE {t} (a int)")
    admin.init(h.settings)
    assert t in insert_only(h)
    skip = h.settings.model_copy(
        update={"filters": h.settings.filters.model_copy(update={"keyless_tables": "skip"})}
    )
    report = admin.init(skip)
    assert any(t in w for w in report.warnings), report.warnings
    assert t not in insert_only(h)
    assert t not in published(h)
    h.sql(f"UPDATE {t} SET a = 1")
    h.sql(f"DROP TABLE {t}")
