"""pg2kafka in a database of its own: tear-down as the database's last CDC stream (the
stack's database has the demo's), and a SQL_ASCII database's text that is not UTF-8."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from services.pg2kafka import admin
from services.pg2kafka.settings import Pg2KafkaSettings
from tests.integration.conftest import Harness, data, delete_topic, make_settings


@pytest.fixture
def make_database(stack_env: dict[str, str], unique_name: str) -> Iterator[Callable[[str], str]]:
    """``make_database(encoding)``: a new database named after the test; dropped after it,
    with its slots."""
    dsn = stack_env["WALCAST_PG_DSN"]
    made: list[str] = []

    def make(encoding: str) -> str:
        with psycopg.connect(dsn, autocommit=True) as c:
            assert encoding in ("UTF8", "SQL_ASCII")
            c.execute(
                f"CREATE DATABASE \"{unique_name}\" TEMPLATE template0 ENCODING '{encoding}'"
                " LC_COLLATE 'C' LC_CTYPE 'C'"
            )
        made.append(unique_name)
        return unique_name

    yield make
    with psycopg.connect(dsn, autocommit=True) as c:
        for name in made:
            c.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE database = %s",
                [name],
            )
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def sql(
    settings: Pg2KafkaSettings, statement: str, params: list[object] | None = None
) -> list[tuple[object, ...]]:
    # The application's SQL: its own search_path (walcast's sessions search pg_catalog only).
    with psycopg.connect(settings.postgres.conninfo(options="-c search_path=public"),
                         autocommit=True) as c:  # fmt: skip
        cur = c.execute(statement, params)
        return cur.fetchall() if cur.description else []


def test_tear_down_of_the_last_cdc_stream_keeps_other_streams_data(
    env_file: Path, unique_name: str, make_database: Callable[[str], str]
) -> None:
    """Before: the last CDC publication's tear-down dropped the whole _walcast schema,
    taking other streams' events, subscriptions and triggers with it."""
    own_database = make_database("UTF8")
    settings = make_settings(env_file, unique_name, postgres={"database": own_database})
    sql(settings, "CREATE TABLE t (id int PRIMARY KEY)")
    admin.init(settings)
    other = 4_000_000_001
    sql(settings, "INSERT INTO _walcast.streams (id) VALUES (%s)", [other])
    sql(settings, "INSERT INTO _walcast.events (payload, stream_id) VALUES ('{}', %s)", [other])
    assert sql(settings, "SELECT count(*) FROM _walcast.publications") == [(1,)]

    removed = admin.tear_down(settings)
    assert f"slot {settings.replication.slot}" in removed
    assert f"publication {settings.replication.publication}" in removed
    # the DDL capture serves CDC streams only: it went with the last one
    assert sql(settings, "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'walcast%'") == [
        (0,)
    ]
    # another stream's events are still there
    assert sql(settings, "SELECT count(*) FROM _walcast.events WHERE stream_id = %s", [other]) == [
        (1,)
    ]

    # a new stream in this database gets the DDL capture back (the schema, and with it
    # the migration ledger, stayed: the migrations do not run again)
    admin.init(settings)
    assert sql(settings, "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'walcast%'") == [
        (2,)
    ]
    admin.tear_down(settings)

    # with nothing of anyone's left, a tear-down removes the schema too
    sql(settings, "DELETE FROM _walcast.events")
    sql(settings, "DELETE FROM _walcast.streams")
    admin.tear_down(settings)
    assert sql(settings, "SELECT to_regnamespace('_walcast')::text") == [(None,)]


def test_a_sql_ascii_database_streams_text_that_is_not_utf8(
    env_file: Path, unique_name: str, make_database: Callable[[str], str], stack_env: dict[str, str]
) -> None:
    """Before: a value that was not UTF-8 stopped decoding, for good, with WAL piling up."""
    own_database = make_database("SQL_ASCII")
    settings = make_settings(
        env_file, unique_name, postgres={"database": own_database}, filters={"include": ["*.*"]}
    )  # the test's own database: every table its own
    sql(settings, "CREATE TABLE t (id int PRIMARY KEY, body text)")
    admin.init(settings)
    dsn = stack_env["WALCAST_PG_DSN"].rsplit("/", 1)[0] + f"/{own_database}"
    h = Harness(settings, dsn)
    h.start()
    try:
        # Latin-1 bytes, as a SQL_ASCII database stores what its clients send.
        sql(settings, "INSERT INTO t VALUES (1, E'\\xe9t\\xe9'), (2, 'plain')")
        h.events(lambda seen: len(data(seen, "t")) >= 2)
        rows = {e["new"]["id"]: e["new"]["body"] for e in data(h.seen, "t")}
        assert rows == {1: "été", 2: "plain"}  # SQL_ASCII: Latin-1, byte for byte
        assert h.service is not None
        assert h.service.cdc.metrics.undecodable._value.get() >= 1
    finally:
        h.stop()
        if h.consumer is not None:
            h.consumer.close()
        admin.tear_down(settings)
        delete_topic(settings)


def test_a_tear_down_waits_for_an_init_of_the_same_database(
    env_file: Path, unique_name: str, make_database: Callable[[str], str]
) -> None:
    """The last stream's tear-down removes the DDL capture: were it to run between another
    stream's ``init`` installing the capture and registering its publication, that stream
    would run without it. Both take one lock per database: a tear-down waits for a
    holder of it (seen in ``pg_locks``, not by timing) and leaves the capture alone
    meanwhile."""
    own_database = make_database("UTF8")
    settings = make_settings(env_file, unique_name, postgres={"database": own_database})
    admin.init(settings)
    with psycopg.connect(settings.postgres.conninfo(), autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext('walcast.streams'))")  # an init
        done: list[object] = []
        worker = threading.Thread(target=lambda: done.append(admin.tear_down(settings)))
        worker.start()
        deadline = time.monotonic() + 60
        while not holder.execute(
            "SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = %s",
            [own_database],
        ).fetchone():
            assert not done, "the tear-down did not wait for the lock"
            assert worker.is_alive(), "the tear-down failed"
            assert time.monotonic() < deadline, "the tear-down never asked for the lock"
            time.sleep(0.05)
        assert admin.ddl_capture_installed(holder), "removed while an init held the lock"
        holder.execute("SELECT pg_advisory_unlock(hashtext('walcast.streams'))")
        worker.join(60)
        assert done, "the tear-down did not end once the lock was free"
        assert not admin.ddl_capture_installed(holder), done
