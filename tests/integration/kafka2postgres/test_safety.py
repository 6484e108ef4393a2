"""What kafka2postgres must not do, and what it does instead:

- run with more than the documented privileges: a role with only CONNECT and CREATE on
  the target database (no superuser) replicates; triggers on the target fire;
- touch a table it did not create: stopped with the reason, untouched, unless
  ``target.adopt_tables``;
- let one table's permanent error stop the others: a constraint the source does not
  have stops that table (its records dead-lettered with the reason), the other table
  goes on; ``resume`` lets it go on;
- remember deleted rows forever: versions of deleted rows older than
  ``target.tombstone_retention_s`` are forgotten.
"""

from __future__ import annotations

import uuid

import psycopg

from services.kafka2postgres import admin
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2postgres.conftest import ReplicaFactory


def test_a_role_with_only_connect_and_create_replicates_and_target_triggers_fire(
    make_harness: HarnessFactory, make_replica: ReplicaFactory, stack_env: dict[str, str]
) -> None:
    h = make_harness()
    t = f"priv_{h.settings.replication.slot[-8:]}"
    h.start()
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)")
    h.sql(f"INSERT INTO {t} SELECT g, 'v' FROM generate_series(1, 20) g")
    role, password = f"k2p_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    probe = make_replica(h.settings.producer.topic)  # for the target's name and dsn
    database = probe.dsn.rsplit("/", 1)[1]
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        c.execute(f'GRANT CONNECT, CREATE ON DATABASE "{database}" TO {role}')
    with psycopg.connect(probe.dsn, autocommit=True) as c:  # a schema that exists already
        c.execute(f"GRANT CREATE ON SCHEMA public TO {role}")  # (Postgres 15+: not for all)
    try:
        r = make_replica(
            h.settings.producer.topic,
            target={"postgres": {"user": role, "password": password}},
            consumer={"group_id": f"{probe.settings.consumer.group_id}-role"},
        ).start()
        r.wait_equal(h.dsn, f"public.{t}", "id")
        owner = r.sql("SELECT tableowner FROM pg_tables WHERE tablename = %s", [t])
        assert owner == [(role,)]
        # a trigger on the target (the owner adds it) fires on kafka2postgres's writes
        r.sql(f"CREATE TABLE public.audit_{t} (id int)")
        body = f"BEGIN INSERT INTO public.audit_{t} VALUES (NEW.id); RETURN NEW; END"
        r.sql(f"CREATE FUNCTION public.audit_{t}() RETURNS trigger LANGUAGE plpgsql AS $${body}$$")
        r.sql(f"CREATE TRIGGER audit AFTER INSERT OR UPDATE ON public.{t}"
              f" FOR EACH ROW EXECUTE FUNCTION public.audit_{t}()")  # fmt: skip
        r.sql(f"GRANT INSERT ON public.audit_{t} TO {role}")
        h.sql(f"UPDATE {t} SET v = 'w' WHERE id <= 5")
        r.wait_equal(h.dsn, f"public.{t}", "id")
        assert r.sql(f"SELECT count(*) FROM public.audit_{t}") == [(5,)]
        r.stop()
    finally:
        with psycopg.connect(probe.dsn, autocommit=True) as c:
            c.execute(f"DROP OWNED BY {role} CASCADE")
        with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as c:
            c.execute(f'REVOKE ALL ON DATABASE "{database}" FROM {role}')
            c.execute(f"DROP ROLE {role}")


def test_a_table_it_did_not_create_is_left_alone_and_one_error_stops_one_table(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    h = make_harness()
    mine = f"mine_{h.settings.replication.slot[-8:]}"
    theirs = f"theirs_{h.settings.replication.slot[-8:]}"
    other = f"other_{h.settings.replication.slot[-8:]}"
    h.start()
    r = make_replica(h.settings.producer.topic)
    r.sql(f"CREATE TABLE public.{theirs} (id int PRIMARY KEY, v text)")  # someone else's
    r.sql(f"INSERT INTO public.{theirs} VALUES (1, 'theirs')")
    for table in (mine, theirs, other):
        h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
        h.sql(f"INSERT INTO {table} SELECT g, g FROM generate_series(1, 10) g")
    r.start()
    r.wait_equal(h.dsn, f"public.{mine}", "id")
    r.wait(lambda: _stopped(r, theirs) is not None, f"{theirs} stopped")
    assert "walcast did not create it" in (_stopped(r, theirs) or "")
    assert r.sql(f"SELECT id, v FROM public.{theirs}") == [(1, "theirs")]  # untouched
    # a constraint the source does not have: that table stops, the other goes on
    r.sql(f"ALTER TABLE public.{mine} ADD CHECK (v < 100)")
    h.sql(f"UPDATE {mine} SET v = 500 WHERE id = 3")
    h.sql(f"UPDATE {other} SET v = 500 WHERE id = 3")
    r.wait(lambda: _stopped(r, mine) is not None, f"{mine} stopped")
    reason = _stopped(r, mine) or ""
    assert "23514" in reason, reason
    assert "check constraint" in reason, reason
    r.wait_equal(h.dsn, f"public.{other}", "id")
    dead = [d["headers"] for d in r.dead_letters(100, timeout=10)]
    assert any(mine in d["walcast-error"].decode() for d in dead), dead
    # the operator fixes it and resumes; the dead-lettered change needs a re-snapshot,
    # a later change of the row brings it
    r.sql(f"ALTER TABLE public.{mine} DROP CONSTRAINT {mine}_v_check")
    r.stop()
    assert admin.resume(r.settings, "public", mine) is True
    assert admin.resume(r.settings, "public", mine) is False
    r2 = make_replica(h.settings.producer.topic).start()
    h.sql(f"UPDATE {mine} SET v = 501 WHERE id = 3")
    r2.wait_equal(h.dsn, f"public.{mine}", "id")


def _stopped(r: object, table: str) -> str | None:
    rows = r.sql(  # type: ignore[attr-defined]
        'SELECT stopped FROM "_walcast_target"."tables" WHERE source_table = %s', [table]
    )
    return rows[0][0] if rows else None


def test_deleted_rows_are_remembered_until_the_retention_then_forgotten(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    h = make_harness()
    t = f"tomb_{h.settings.replication.slot[-8:]}"
    h.start()
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    h.sql(f"INSERT INTO {t} SELECT generate_series(1, 10)")
    h.sql(f"DELETE FROM {t} WHERE id <= 4")
    r = make_replica(h.settings.producer.topic, target={"tombstone_retention_s": 3600}).start()
    r.wait_equal(h.dsn, f"public.{t}", "id")
    tombs = 'SELECT count(*) FROM "_walcast_target"."rows" WHERE deleted'
    assert r.sql(tombs) == [(4,)]
    r.stop()
    r.sql("UPDATE \"_walcast_target\".\"rows\" SET at = now() - interval '2 hours'"
          " WHERE deleted AND key IN ('(1)', '(2)')")  # fmt: skip
    again = make_replica(
        h.settings.producer.topic, target={"tombstone_retention_s": 3600}
    ).start()  # a new process prunes at its first write
    h.sql(f"INSERT INTO {t} VALUES (11)")
    again.wait_equal(h.dsn, f"public.{t}", "id")
    again.wait(lambda: again.sql(tombs) == [(2,)], "the two old versions forgotten")
