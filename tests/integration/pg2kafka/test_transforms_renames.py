"""Transform rules against renames and DDL statement text, with real Postgres and Kafka
(issue 36, finding 5): a redacted column renamed stops pg2kafka before anything of the
table's new shape is sent — at the DDL event where DDL capture is installed, at the
pgoutput Relation message where it is not — and no clear value ever reaches the topic;
with the rule changed to the new name a restart resumes at the change and the rows
arrive redacted. A DDL statement sent with an UPDATE does not carry its literal out.
(The logic: tests/unit/pg2kafka/test_transforms_renames.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from services.pg2kafka import admin
from services.pg2kafka.transforms import WITHHELD
from shared.errors import PermanentError
from tests.integration.conftest import Harness, HarnessFactory, data

ANN, BOB, CY = "ann@corp.example.org", "bob@corp.example.org", "cy@corp.example.org"


@pytest.fixture
def own_database(stack_env: dict[str, str], unique_name: str) -> Iterator[str]:
    """A database of the test's own, dropped after it with its slots (requested before
    ``make_harness``, so the harness is torn down first)."""
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{unique_name}"')
    yield unique_name
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE database = %s AND NOT active",
            [unique_name],
        )
        c.execute(f'DROP DATABASE "{unique_name}" WITH (FORCE)')


def redact(*columns: str) -> dict[str, Any]:
    return {"rules": [{"column": c, "action": "redact"} for c in columns]}


def make(
    make_harness: HarnessFactory, schema: str, rule: str, **sections: dict[str, Any]
) -> Harness:
    return make_harness(
        init=False,
        filters={"include": [f"{schema}.*"]},
        snapshot={"mode": "never"},
        transforms=redact(rule),
        **sections,
    )


def sql(h: Harness, statement: str) -> None:
    with psycopg.connect(h.settings.postgres.conninfo(), autocommit=True) as conn:
        conn.execute(statement)


def confirmed_past_now(h: Harness) -> Callable[[list[dict[str, Any]]], bool]:
    """A condition for ``events``: the slot confirmed everything written so far (a
    restart then resumes after it)."""
    with psycopg.connect(h.settings.postgres.conninfo(), autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    now = int(row[0])
    return lambda _seen: h.slot_confirmed() >= now


def whole_topic(h: Harness) -> list[str]:
    """Every record of the topic, read to its end with a consumer of its own."""
    topic = h.settings.producer.topic
    c = Consumer({"bootstrap.servers": h.settings.kafka.bootstrap_servers,
                  "group.id": f"grep-{uuid.uuid4().hex}", "enable.auto.commit": False})  # fmt: skip
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        values: list[str] = []
        left = {p for p, end in ends.items() if end > 0}
        while left:
            for msg in c.consume(500, 1.0):
                if msg.error():
                    continue
                values.append((msg.value() or b"").decode("utf-8", "replace"))
                offset, partition = msg.offset(), msg.partition()
                if offset is not None and partition is not None and offset + 1 >= ends[partition]:
                    left.discard(partition)
        return values
    finally:
        c.close()


def stopped(h: Harness, match: str) -> None:
    assert h.thread is not None
    h.thread.join(90)
    assert not h.thread.is_alive(), "pg2kafka went on streaming the renamed column"
    with pytest.raises(PermanentError, match=match):
        h.stop()
    h.error.clear()  # seen: the teardown stops it without raising it again
    if h.consumer is not None:
        h.consumer.close()  # the restart's harness reads in the same consumer group
        h.consumer = None


def rename_then_restart(
    make_harness: HarnessFactory, schema: str, where: str,
    after_init: Callable[[Harness], None] = lambda h: None,
) -> None:  # fmt: skip
    """The scenario of both tests: a redacted column renamed while pg2kafka streams."""
    h = make(make_harness, schema, f"{schema}.users.email")
    sql(h, f"CREATE SCHEMA {schema}")
    sql(h, f"CREATE TABLE {schema}.users (id int PRIMARY KEY, email text)")
    admin.init(h.settings)
    after_init(h)
    h.start()
    sql(h, f"INSERT INTO {schema}.users VALUES (1, '{ANN}')")
    h.events(lambda seen: len(data(seen, "users")) == 1)
    h.events(confirmed_past_now(h))

    sql(h, f"ALTER TABLE {schema}.users RENAME COLUMN email TO contact_email")
    sql(h, f"UPDATE {schema}.users SET contact_email = '{BOB}' WHERE id = 1")
    sql(h, f"INSERT INTO {schema}.users VALUES (2, '{CY}')")
    stopped(h, rf"{schema}\.users\.email \(rule .*{where} shows the table as {schema}\.users"
               r" with columns \(id, contact_email\)")  # fmt: skip
    records = whole_topic(h)
    for clear in (ANN, BOB, CY):
        assert clear not in "\n".join(records), clear
    # the insert only: neither the DDL event nor a row of the new shape went out
    assert [orjson.loads(r)["op"] for r in records] == ["insert"]

    # The rule changed to the new name: the restart resumes at the rename.
    h2 = make(make_harness, schema, f"{schema}.users.contact_email")
    h2.start()
    h2.events(lambda seen: len(data(seen, "users")) == 3)
    update, insert = data(h2.seen, "users")[1:]
    assert update["op"] == "update"
    assert update["new"] == {"id": 1, "contact_email": "REDACTED"}
    assert insert["new"] == {"id": 2, "contact_email": "REDACTED"}
    for clear in (ANN, BOB, CY):
        assert clear not in "\n".join(whole_topic(h2)), clear
    h2.stop()  # before the teardown of the first harness drops the slot


def test_a_renamed_redacted_column_stops_at_the_ddl_event_and_resumes_once_fixed(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """DDL capture installed (the stack's owner is a superuser): the stop comes at the
    DDL event, which is not sent."""
    schema = f"t_{unique_name}"
    rename_then_restart(make_harness, schema, "the DDL event at LSN [0-9A-F/]+")


def test_a_renamed_redacted_column_stops_at_the_relation_message_without_ddl_capture(
    own_database: str, make_harness: HarnessFactory, unique_name: str
) -> None:
    """No DDL capture (a NOSUPERUSER owner's install): pg2kafka learns of the rename from
    the Relation message before the first row of the new shape. Event triggers are per
    database: disabled in a database of the test's own."""
    schema = f"t_{unique_name}"

    def in_own_database(**sections: Any) -> Harness:
        return make_harness(postgres={"database": own_database}, **sections)

    def without_ddl_capture(h: Harness) -> None:
        sql(h, "ALTER EVENT TRIGGER walcast_ddl_command_end DISABLE")
        sql(h, "ALTER EVENT TRIGGER walcast_sql_drop DISABLE")

    rename_then_restart(in_own_database, schema, "Relation message", without_ddl_capture)


def test_a_ddl_statement_sent_with_an_update_does_not_carry_its_literal(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"t_{unique_name}"
    h = make(make_harness, schema, f"{schema}.users.email")
    sql(h, f"CREATE SCHEMA {schema}")
    sql(h, f"CREATE TABLE {schema}.users (id int PRIMARY KEY, email text)")
    sql(h, f"CREATE TABLE {schema}.orders (id int PRIMARY KEY)")
    sql(h, f"INSERT INTO {schema}.users VALUES (1, '{ANN}')")
    admin.init(h.settings)
    h.start()
    # One query string, as a migration tool sends it: the DDL message carries it whole.
    sql(h, f"ALTER TABLE {schema}.users ADD COLUMN note text;"
           f" UPDATE {schema}.users SET email = '{BOB}' WHERE id = 1;"
           f" ALTER TABLE {schema}.orders ADD COLUMN at date;"
           f" UPDATE {schema}.users SET email = '{CY}' WHERE id = 1")  # fmt: skip
    h.events(lambda seen: len([e for e in seen if e["op"] in ("ddl", "update")]) == 4)
    ddls = [e for e in h.seen if e["op"] == "ddl"]
    assert {e["table"] for e in ddls} == {"users", "orders"}
    assert {e["ddl"]["statement"] for e in ddls} == {WITHHELD}
    everything = "\n".join(whole_topic(h))
    for clear in (ANN, BOB, CY):
        assert clear not in everything, clear


def stops_of(h: Harness) -> list[tuple[Any, ...]]:
    with psycopg.connect(h.settings.postgres.conninfo(), autocommit=True) as conn:
        return conn.execute(
            "SELECT schema_name, table_name, column_name, rule, attnum"
            " FROM _walcast.transform_stops WHERE slot = %s",
            [h.settings.replication.slot],
        ).fetchall()


def restart_refused(
    make_harness: HarnessFactory, schema: str, where: str,
    after_init: Callable[[Harness], None] = lambda h: None,
) -> None:  # fmt: skip
    """A wildcard still matching another column of the table after the rename: the stop
    is recorded, and a restart with the rules unchanged — the new shape's Relation
    message or DDL event is not compared with anything then — is refused until a rule
    covers the new name."""
    rule = f"{schema}.users.*mail*"
    h = make(make_harness, schema, rule)
    sql(h, f"CREATE SCHEMA {schema}")
    sql(h, f"CREATE TABLE {schema}.users (id int PRIMARY KEY, email text, mailing_opt text)")
    admin.init(h.settings)
    after_init(h)
    h.start()
    sql(h, f"INSERT INTO {schema}.users VALUES (1, '{ANN}', 'weekly')")
    h.events(lambda seen: len(data(seen, "users")) == 1)
    h.events(confirmed_past_now(h))

    sql(h, f"ALTER TABLE {schema}.users RENAME COLUMN email TO contact")
    sql(h, f"UPDATE {schema}.users SET contact = '{BOB}' WHERE id = 1")
    sql(h, f"INSERT INTO {schema}.users VALUES (2, '{CY}', 'never')")
    stopped(h, rf"{schema}\.users\.email \(rule .*{where} shows the table as {schema}\.users")
    assert stops_of(h) == [(schema, "users", "email", rule, 2)]

    # Restarted with the same rules (a crash-loop's restart): refused at start.
    h2 = make(make_harness, schema, rule)
    h2.start()
    stopped(h2, rf"{schema}\.users\.email \(rule '{schema}\.users\.\*mail\*'; stopped"
                rf" .*\) is now {schema}\.users\.contact.* DELETE FROM"
                r" _walcast\.transform_stops WHERE slot")  # fmt: skip
    records = whole_topic(h2)
    for clear in (ANN, BOB, CY):
        assert clear not in "\n".join(records), clear
    assert [orjson.loads(r)["op"] for r in records] == ["insert"]

    # A rule covering the new name: the restart settles the record and streams redacted.
    h3 = make_harness(init=False, filters={"include": [f"{schema}.*"]},
                      snapshot={"mode": "never"},
                      transforms=redact(rule, f"{schema}.users.contact"))  # fmt: skip
    h3.start()
    h3.events(lambda seen: len(data(seen, "users")) == 3)
    update, insert = data(h3.seen, "users")[1:]
    assert update["new"] == {"id": 1, "contact": "REDACTED", "mailing_opt": "REDACTED"}
    assert insert["new"] == {"id": 2, "contact": "REDACTED", "mailing_opt": "REDACTED"}
    for clear in (ANN, BOB, CY):
        assert clear not in "\n".join(whole_topic(h3)), clear
    assert stops_of(h3) == []
    h3.stop()


def test_a_restart_with_unchanged_rules_after_a_stop_is_refused_until_a_rule_covers_it(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """DDL capture installed: the stop comes at the DDL event."""
    restart_refused(make_harness, f"t_{unique_name}", "the DDL event at LSN [0-9A-F/]+")


def test_a_restart_after_a_stop_at_the_relation_message_is_refused_too(
    own_database: str, make_harness: HarnessFactory, unique_name: str
) -> None:
    """No DDL capture: the stop comes at the Relation message (names only); the column's
    number comes from the catalog read at start-up."""

    def in_own_database(**sections: Any) -> Harness:
        return make_harness(postgres={"database": own_database}, **sections)

    def without_ddl_capture(h: Harness) -> None:
        sql(h, "ALTER EVENT TRIGGER walcast_ddl_command_end DISABLE")
        sql(h, "ALTER EVENT TRIGGER walcast_sql_drop DISABLE")

    restart_refused(in_own_database, f"t_{unique_name}", "Relation message", without_ddl_capture)


def test_tear_down_removes_the_slots_transform_stops(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    h = make_harness(snapshot={"mode": "never"})
    sql(h, "INSERT INTO _walcast.transform_stops (slot, table_oid, attnum, schema_name,"
           f" table_name, column_name, rule) VALUES ('{h.settings.replication.slot}', 1, 1,"
           " 's', 't', 'c', 's.t.c'), ('other_slot', 1, 1, 's', 't', 'c', 's.t.c')")  # fmt: skip
    admin.tear_down(h.settings)
    with psycopg.connect(h.settings.postgres.conninfo(), autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('_walcast.transform_stops')").fetchone() == (None,):
            return  # nothing of any stream was left: the schema went, records with it
        left = conn.execute("SELECT slot FROM _walcast.transform_stops WHERE table_oid = 1"
                            " AND slot IN (%s, 'other_slot')",
                            [h.settings.replication.slot]).fetchall()  # fmt: skip
        conn.execute("DELETE FROM _walcast.transform_stops WHERE slot = 'other_slot'")
    assert left == [("other_slot",)]


def old_column_kept(
    make_harness: HarnessFactory, schema: str, where: str,
    after_init: Callable[[Harness], None] = lambda h: None,
) -> None:  # fmt: skip
    """The keep-the-old-column migration: ``email`` renamed to ``email_old`` and a new
    ``email`` added — the rule's name is still there, the addresses are not under it. The
    stream stops, records the column by its number, and no address reaches the topic."""
    h = make(make_harness, schema, f"{schema}.users.email")
    sql(h, f"CREATE SCHEMA {schema}")
    sql(h, f"CREATE TABLE {schema}.users (id int PRIMARY KEY, email text)")
    admin.init(h.settings)
    after_init(h)
    h.start()
    sql(h, f"INSERT INTO {schema}.users VALUES (1, '{ANN}')")
    h.events(lambda seen: len(data(seen, "users")) == 1)
    h.events(confirmed_past_now(h))

    sql(h, f"ALTER TABLE {schema}.users RENAME COLUMN email TO email_old")
    sql(h, f"ALTER TABLE {schema}.users ADD COLUMN email text")
    sql(h, f"UPDATE {schema}.users SET email = 'new' WHERE id = 1")
    sql(h, f"INSERT INTO {schema}.users VALUES (2, '{BOB}', 'x')")
    stopped(h, rf"{schema}\.users\.email \(rule .*{where} shows the table as {schema}\.users")
    records = whole_topic(h)
    for clear in (ANN, BOB):
        assert clear not in "\n".join(records), clear
    assert [orjson.loads(r)["op"] for r in records] == ["insert"]
    assert stops_of(h) == [(schema, "users", "email", f"{schema}.users.email", 2)]

    # Restarted with the rules unchanged: refused, column 2 is email_old now.
    h2 = make(make_harness, schema, f"{schema}.users.email")
    h2.start()
    stopped(h2, rf"{schema}\.users\.email \(rule .*\) is now {schema}\.users\.email_old")
    for clear in (ANN, BOB):
        assert clear not in "\n".join(whole_topic(h2)), clear


def test_keep_the_old_column_migration_stops_without_ddl_capture(
    own_database: str, make_harness: HarnessFactory, unique_name: str
) -> None:
    """No DDL capture (the NOSUPERUSER install): one Relation message [id, email_old,
    email] shows the change; the name ``email`` is still there, so the column is followed
    by its attribute number, read from the catalog."""

    def in_own_database(**sections: Any) -> Harness:
        return make_harness(postgres={"database": own_database}, **sections)

    def without_ddl_capture(h: Harness) -> None:
        sql(h, "ALTER EVENT TRIGGER walcast_ddl_command_end DISABLE")
        sql(h, "ALTER EVENT TRIGGER walcast_sql_drop DISABLE")

    old_column_kept(in_own_database, f"t_{unique_name}",
                    r"column 2 is now named email_old\).*Relation message",
                    without_ddl_capture)  # fmt: skip


def test_keep_the_old_column_migration_stops_with_ddl_capture(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """DDL capture installed: the stop comes at the DDL event of the rename."""
    old_column_kept(make_harness, f"t_{unique_name}", "the DDL event at LSN [0-9A-F/]+")
