"""Tables without a replica identity never make the application's statements fail.

Before V008, ``init`` created a ``FOR ALL TABLES`` publication, after which Postgres
refused every UPDATE and DELETE on a table without a primary key ("cannot update table
... because it does not have a replica identity and publishes updates")."""

from __future__ import annotations

import psycopg
import pytest

from services.pg2kafka import admin
from tests.integration.conftest import Harness, HarnessFactory, data


def published(h: Harness) -> set[str]:
    rows = h.sql(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
        [h.settings.replication.publication],
    )
    return {r[0] for r in rows}


def test_keyless_tables_are_left_out_and_join_when_they_gain_a_key(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    keyless, keyed = f"{unique_name}_nokey", f"{unique_name}_key"
    h = make_harness(init=False)
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
    t = f"{unique_name}_full"
    h = make_harness(init=False, filters={"keyless_tables": "full_identity"})
    h.sql(f"CREATE TABLE {t} (a int, b text)")
    report = admin.init(h.settings)
    assert f"REPLICA IDENTITY FULL on public.{t}" in report.created
    assert t in published(h)
    later = f"{t}_later"
    h.sql(f"CREATE TABLE {later} (a int)")  # created after init: same rule
    assert h.sql("SELECT relreplident FROM pg_class WHERE oid = %s::regclass", [later]) == [("f",)]
    assert later in published(h)
    h.start()
    h.sql(f"INSERT INTO {t} VALUES (1, 'x')")
    h.sql(f"UPDATE {t} SET b = 'y'")
    h.events(lambda s: len(data(s, t)) >= 3)
    # Without a primary key, FULL identity makes every column the key: the update moved
    # the row to another key, so it travels as a delete of the old row and an insert.
    gone, moved = data(h.seen, t)[-2:]
    assert (gone["op"], gone["old"]) == ("delete", {"a": 1, "b": "x"})  # the whole old row
    assert (moved["op"], moved["new"]) == ("insert", {"a": 1, "b": "y"})
    h.sql(f"DROP TABLE {t}, {later}")


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
