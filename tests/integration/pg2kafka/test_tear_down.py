"""tear-down removes what its stream owns, never what other streams hold in _walcast.

In a database of its own, so that this stream is the database's last CDC stream (the
stack's database has the demo's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from services.pg2kafka import admin
from services.pg2kafka.settings import Pg2KafkaSettings
from tests.integration.conftest import make_settings


@pytest.fixture
def own_database(stack_env: dict[str, str], unique_name: str) -> Iterator[str]:
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{unique_name}"')
    yield unique_name
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE database = %s",
            [unique_name],
        )
        c.execute(f'DROP DATABASE "{unique_name}" WITH (FORCE)')


def sql(
    settings: Pg2KafkaSettings, statement: str, params: list[object] | None = None
) -> list[tuple[object, ...]]:
    with psycopg.connect(settings.postgres.conninfo(), autocommit=True) as c:
        cur = c.execute(statement, params)
        return cur.fetchall() if cur.description else []


def test_tear_down_of_the_last_cdc_stream_keeps_other_streams_data(
    env_file: Path, unique_name: str, own_database: str
) -> None:
    """Before: the last CDC publication's tear-down dropped the whole _walcast schema,
    taking other streams' events, subscriptions and triggers with it."""
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

    # with nothing of anyone's left, a tear-down removes the schema too
    sql(settings, "DELETE FROM _walcast.events")
    sql(settings, "DELETE FROM _walcast.streams")
    admin.tear_down(settings)
    assert sql(settings, "SELECT to_regnamespace('_walcast')::text") == [(None,)]
