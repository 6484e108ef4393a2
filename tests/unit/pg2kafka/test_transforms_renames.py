"""Transform rules against renames (services/pg2kafka/transform_shapes.py) and DDL
statement text (issue 36, finding 5): a covered column or its table renamed, moved to
another schema or dropped stops the stream at the Relation message or DDL event that
shows it, before anything of that shape is built; wildcards that still match keep
working; replays older than what the process knows are held against it the other way
round; DDL events carry no statement text while rules exist. Against Postgres and Kafka:
tests/integration/pg2kafka/test_transforms_renames.py."""

from __future__ import annotations

import struct
from typing import Any

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.settings import TransformSettings
from services.pg2kafka.transforms import (
    WITHHELD,
    CatalogColumn,
    Transforms,
    check_catalog,
    from_settings,
)
from services.pg2kafka.types import TypeRegistry
from shared.avro import event_schema, event_to_avro
from shared.errors import ConfigError, PermanentError

OID = 16390
EMAIL = "ann@corp.example.org"


def rel(*names: str, schema: str = "app", table: str = "users", oid: int = OID) -> pg.Relation:
    cols = tuple(pg.Column(n, 25, -1, n == "id") for n in names)
    return pg.Relation(oid, schema, table, "d", cols)


def transforms(*columns: str) -> Transforms:
    rules = [{"column": c, "action": "redact"} for c in columns]
    return Transforms(TransformSettings(rules=rules))  # type: ignore[arg-type]


def builder(t: Transforms, commit_lsn: int = 1000) -> EventBuilder:
    b = EventBuilder("db", TypeRegistry(), transforms=t)
    b.begin(pg.Begin(commit_lsn, 1_700_000_000_000_000, 7))
    return b


def insert(b: EventBuilder, *values: str) -> dict[str, Any]:
    (ev,) = b.change(pg.Insert(OID, values), 400)
    out: dict[str, Any] = orjson.loads(orjson.dumps(ev))
    return out


def ddl(*tables: dict[str, Any], statement: str = "ALTER TABLE ...") -> pg.Message:
    payload = {"tag": "ALTER TABLE", "statement": statement, "tables": list(tables)}
    return pg.Message(True, 1, "walcast.ddl", orjson.dumps(payload))


def shape(*names: str, table: str = "users", **extra: Any) -> dict[str, Any]:
    cols = [{"name": n, "type": "text", "sql_type": "text", "nullable": True, "num": i}
            for i, n in enumerate(names, 1)]  # fmt: skip
    return {"schema": "app", "table": table, "columns": cols, "primary_key": ["id"], **extra}


def test_a_renamed_column_stops_the_stream_at_its_relation_message() -> None:
    b = builder(transforms("app.users.email"))
    b.relation(rel("id", "email"))
    assert insert(b, "1", EMAIL)["new"]["email"] == "REDACTED"
    with pytest.raises(PermanentError) as err:
        b.relation(rel("id", "contact_email"))
    message = str(err.value)
    assert "app.users.email (rule 'app.users.email')" in message
    assert "Relation message" in message
    assert "(id, contact_email)" in message
    assert "change transforms.rules to the new names" in message
    # nothing of the new shape was taken: a row for it cannot be built
    assert [c.name for c in b.relations[OID].columns] == ["id", "email"]


def test_the_relation_path_reads_what_the_pgoutput_decoder_gives() -> None:
    def relation_bytes(*names: str) -> bytes:
        cols = b"".join(
            (b"\x01" if n == "id" else b"\x00") + n.encode() + b"\0" + struct.pack("!Ii", 25, -1)
            for n in names
        )
        return (b"R" + struct.pack("!I", OID) + b"app\0users\0d"
                + struct.pack("!h", len(names)) + cols)  # fmt: skip

    b = builder(transforms("app.users.email"))
    first = pg.decode(relation_bytes("id", "email"))
    assert isinstance(first, pg.Relation)
    b.relation(first)
    renamed = pg.decode(relation_bytes("id", "contact_email"))
    assert isinstance(renamed, pg.Relation)
    with pytest.raises(PermanentError, match=r"app\.users\.email"):
        b.relation(renamed)


@pytest.mark.parametrize(
    ("schema", "table"), [("app", "customers"), ("archive", "users")], ids=["table", "schema"]
)
def test_a_renamed_or_moved_table_stops_the_stream(schema: str, table: str) -> None:
    b = builder(transforms("app.users.email"))
    b.relation(rel("id", "email"))
    with pytest.raises(PermanentError, match=rf"as {schema}\.{table} with columns"):
        b.relation(rel("id", "email", schema=schema, table=table))


def test_rules_that_cover_the_new_name_keep_the_stream_going() -> None:
    # a wildcard matching the renamed column, and a table wildcard matching the new name
    t = transforms("app.user*.*mail*", "app.user*.phone")
    b = builder(t)
    b.relation(rel("id", "email", "phone"))
    b.relation(rel("id", "contact_email", "phone"))
    assert insert(b, "1", EMAIL, "555")["new"] == {
        "id": "1", "contact_email": "REDACTED", "phone": "REDACTED"}  # fmt: skip
    b.relation(rel("id", "contact_email", "phone", table="users_v2"))
    # the wildcard that matched the renamed column matches no new column: stop
    with pytest.raises(PermanentError, match=r"app\.users_v2\.contact_email"):
        b.relation(rel("id", "contact", "phone", table="users_v2"))
    # ... even while it still matches another column of the table
    b = builder(transforms("app.users.*mail*"))
    b.relation(rel("id", "email", "backup_mail"))
    with pytest.raises(PermanentError, match=r"app\.users\.email \(rule"):
        b.relation(rel("id", "contact", "backup_mail"))


def test_drop_and_add_under_the_same_name_is_covered_again_but_a_drop_alone_stops() -> None:
    b = builder(transforms("app.users.email"))
    b.relation(rel("id", "email", "note"))
    b.relation(rel("id", "note", "email"))  # dropped and added back: matched by name
    assert insert(b, "1", "n", EMAIL)["new"]["email"] == "REDACTED"
    with pytest.raises(PermanentError, match="or the column dropped"):
        b.relation(rel("id", "note"))  # names alone cannot tell a drop from a rename


def test_a_ddl_event_renaming_a_covered_column_stops_before_any_event() -> None:
    b = builder(transforms("app.users.email"))
    b.relation(rel("id", "email"))
    with pytest.raises(PermanentError, match=r"the DDL event at LSN 0/190 .*\(id, contact_email\)"):
        b.ddl(ddl(shape("id", "contact_email")), 400)
    assert b.txn is not None
    assert b.txn.events == 0


def test_a_ddl_event_with_the_table_oid_catches_a_table_rename() -> None:
    b = builder(transforms("app.users.email"))
    b.relation(rel("id", "email"))
    with pytest.raises(PermanentError, match=r"as app\.customers"):
        b.ddl(ddl(shape("id", "email", table="customers", oid=OID)), 400)
    # Without the oid the DDL event cannot tell; the Relation message before the first
    # row under the new name does.
    b = builder(transforms("app.users.email"))
    b.relation(rel("id", "email"))
    assert len(b.ddl(ddl(shape("id", "email", table="customers")), 400)) == 1
    with pytest.raises(PermanentError, match=r"as app\.customers"):
        b.relation(rel("id", "email", table="customers"))


def test_a_table_seen_first_in_a_ddl_event_is_followed_to_its_relation_message() -> None:
    b = builder(transforms("app.users.email"))
    create = orjson.loads(ddl(shape("id", "email")).content)
    create["tag"] = "CREATE TABLE"
    b.ddl(pg.Message(True, 1, "walcast.ddl", orjson.dumps(create)), 300)
    with pytest.raises(PermanentError, match=r"app\.users\.email"):
        b.ddl(ddl(shape("id", "contact_email")), 400)
    b2 = builder(transforms("app.users.email"))
    b2.ddl(pg.Message(True, 1, "walcast.ddl", orjson.dumps(create)), 300)
    with pytest.raises(PermanentError, match=r"app\.users\.email"):
        b2.relation(rel("id", "contact_email"))


def test_a_dropped_table_frees_its_name() -> None:
    b = builder(transforms("app.users.email"))
    b.ddl(ddl(shape("id", "email")), 300)
    drop = {"tag": "DROP TABLE", "statement": "DROP TABLE users",
            "dropped": [{"schema": "app", "table": "users"}]}  # fmt: skip
    b.ddl(pg.Message(True, 1, "walcast.ddl", orjson.dumps(drop)), 310)
    b.ddl(ddl(shape("id", "name")), 320)  # another table under the name


def catalog(*names: str, table: str = "users") -> list[CatalogColumn]:
    return [CatalogColumn("app", table, n, n == "id", OID) for n in names]


def test_the_start_up_catalog_is_the_first_shape_of_an_idle_table() -> None:
    """pg2kafka starts, the table changes no row; it is renamed; the first row after:
    its Relation message is the first of the table in the session."""
    t = transforms("app.users.email")
    streamed = TableFilter(["app.*"], [])
    t.shapes.remember_catalog([(c.oid, c.schema, c.table, c.column, c.attnum) for c in catalog(
        "id", "email")], streamed, lsn=5000)  # fmt: skip
    with pytest.raises(PermanentError, match=r"as app\.customers"):
        builder(t, commit_lsn=6000).relation(rel("id", "email", table="customers"))
    # A table the filters leave out sends nothing: not held to its shape.
    builder(t, commit_lsn=6000).relation(rel("id", "email", table="customers", schema="other"))


def test_a_replay_older_than_the_catalog_is_held_against_it_the_other_way() -> None:
    """Restarted with the rule changed to the new name, the stream resends changes from
    before the rename: their old name has no rule now. A column added since (in the
    catalog, not in the replayed shape) is no reason to stop."""
    t = transforms("app.users.contact_email", "app.users.secret")
    t.shapes.remember_catalog([(c.oid, c.schema, c.table, c.column, c.attnum) for c in catalog(
        "id", "contact_email", "secret")], TableFilter(["app.*"], []), lsn=5000)  # fmt: skip
    builder(t, commit_lsn=4000).relation(rel("id", "contact_email"))  # secret added later
    with pytest.raises(PermanentError, match=r"app\.users\.contact_email"):
        builder(t, commit_lsn=4000).relation(rel("id", "email"))
    # After the rename the shapes match the catalog: no stop.
    builder(t, commit_lsn=5000).relation(rel("id", "contact_email", "secret"))
    # A rule covering both names lets the replay through.
    t = transforms("app.users.*email")
    t.shapes.remember_catalog([(c.oid, c.schema, c.table, c.column, c.attnum) for c in catalog(
        "id", "contact_email")], TableFilter(["app.*"], []), lsn=5000)  # fmt: skip
    builder(t, commit_lsn=4000).relation(rel("id", "email"))


def test_a_reconnect_keeps_what_the_last_session_saw() -> None:
    settings = TransformSettings(rules=[{"column": "app.users.email", "action": "redact"}])  # type: ignore[list-item]
    t = from_settings(settings)
    assert t is not None
    assert from_settings(settings) is t
    builder(t, commit_lsn=1000).relation(rel("id", "email"))
    # the next session replays the same transaction: older or the same, not compared
    builder(t, commit_lsn=1000).relation(rel("id", "email"))
    with pytest.raises(PermanentError, match=r"app\.users\.email"):
        builder(t, commit_lsn=2000).relation(rel("id", "contact_email"))


def test_the_start_up_check_refuses_a_table_wildcard_rule_that_matches_nothing() -> None:
    t = transforms("app.users.*mail*")
    streamed = TableFilter(["app.*"], [])
    with pytest.raises(ConfigError, match=r"matches no column of table app\.users"):
        check_catalog(t, catalog("id", "contact"), streamed)
    assert check_catalog(t, catalog("id", "contact_email"), streamed) == {"app.users.*mail*": 1}
    # a rule for tables to come (or another table's) only warns
    assert check_catalog(transforms("app.*.email"), catalog("id"), streamed) == {"app.*.email": 0}


@pytest.mark.parametrize("rules", [("app.users.email",), ("app.other.x",)], ids=["same", "other"])
def test_ddl_statements_are_withheld_while_rules_exist(rules: tuple[str, ...]) -> None:
    """An UPDATE sent with the ALTER TABLE carries the literal the update event redacts;
    it may name any table, so no statement travels while rules are configured."""
    statement = "ALTER TABLE users ADD COLUMN note text; UPDATE users SET email='x@y' WHERE id=1"
    b = builder(transforms(*rules))
    b.relation(rel("id", "email"))
    (ev,) = b.ddl(ddl(shape("id", "email", "note"), statement=statement), 400)
    assert ev["ddl"]["statement"] == WITHHELD
    assert "x@y" not in orjson.dumps(ev).decode()
    # Avro (producer.encoding=avro) carries the same ddl object
    datum = event_to_avro(ev, event_schema("db", "app", "users", {}, []))
    assert orjson.loads(datum["ddl"])["statement"] == WITHHELD
    # without rules the statement travels (secrets scrubbed)
    plain = EventBuilder("db", TypeRegistry())
    plain.begin(pg.Begin(1000, 1_700_000_000_000_000, 7))
    (ev,) = plain.ddl(ddl(shape("id", "email", "note"), statement=statement), 400)
    assert ev["ddl"]["statement"] == statement


# -- a covered column followed by its attribute number (a name another column took) ---


def numbered(t: Transforms, *columns: tuple[int, str]) -> list[Any]:
    """The catalog now answers with ``columns`` (attnum, name) for OID; the stops the
    shape check records are returned in the list."""
    recorded: list[Any] = []
    t.shapes.catalog = lambda oid: [(n, name, False) for n, name in columns] if oid == OID else None
    t.shapes.recorder = recorded.extend
    return recorded


def test_keep_the_old_column_migration_stops_at_the_relation_message() -> None:
    """The reviewer's case: ``RENAME email TO email_old; ADD COLUMN email text`` then an
    UPDATE: one Relation message [id, email_old, email] — the name ``email`` is still
    there, the addresses are in ``email_old``."""
    t = transforms("public.users.email")
    recorded = numbered(t, (1, "id"), (2, "email"))
    s = t.shapes.session()
    t.shapes.check(OID, "public", "users", ["id", "email"], session=s, lsn=None, where="R")
    numbered(t, (1, "id"), (2, "email_old"), (3, "email"))
    t.shapes.recorder = recorded.extend
    with pytest.raises(PermanentError) as err:
        t.shapes.check(OID, "public", "users", ["id", "email", "email_old"], session=s,
                       lsn=None, where="the stream's Relation message")  # fmt: skip
    message = str(err.value)
    assert "public.users.email (rule 'public.users.email': column 2 is now named email_old)" in (
        message
    )
    assert "change transforms.rules" in message
    assert [(r.oid, r.attnum, r.column) for r in recorded] == [(OID, 2, "email")]


def test_keep_the_old_column_migration_stops_after_the_start_up_catalog() -> None:
    t = transforms("app.users.email")
    t.shapes.remember_catalog([(OID, "app", "users", "id", 1), (OID, "app", "users", "email", 2)],
                              TableFilter(["app.*"], []), lsn=5000)  # fmt: skip
    numbered(t, (1, "id"), (2, "email_old"), (3, "email"))
    b = builder(t, commit_lsn=6000)
    with pytest.raises(PermanentError, match="column 2 is now named email_old"):
        b.relation(rel("id", "email_old", "email"))
    assert OID not in b.relations


def test_keep_the_old_column_migration_stops_at_the_ddl_event_by_its_numbers() -> None:
    t = transforms("app.users.email")
    b = builder(t)
    b.ddl(ddl(shape("id", "email")), 300)
    with pytest.raises(PermanentError, match="column 2 is now named email_old"):
        b.ddl(ddl(shape("id", "email_old", "email")), 400)
    # ... and a swap of names keeps every name but moves the data
    b = builder(transforms("app.users.email"))
    b.ddl(ddl(shape("id", "email", "note")), 300)
    swapped = shape("id", "note", "email")
    with pytest.raises(PermanentError, match="column 2 is now named note"):
        b.ddl(ddl(swapped), 400)


def test_a_swap_of_names_stops_at_the_relation_message() -> None:
    t = transforms("app.users.email")
    numbered(t, (1, "id"), (2, "email"), (3, "note"))
    b = builder(t)
    b.relation(rel("id", "email", "note"))
    numbered(t, (1, "id"), (2, "note"), (3, "email"))
    with pytest.raises(PermanentError, match="column 2 is now named note"):
        b.relation(rel("id", "note", "email"))


def test_a_catalog_ahead_of_the_stream_is_read_conservatively() -> None:
    t = transforms("app.users.email", "app.users.secret")
    numbered(t, (1, "id"), (2, "email"))
    b = builder(t)
    b.relation(rel("id", "email"))
    # Columns added since the shape (a covered one among them): nothing shown moved.
    numbered(t, (1, "id"), (2, "email"), (3, "note"), (4, "secret"))
    b.relation(rel("id", "email", "note"))
    # The stream shows [id, email_old, email]; the catalog has since renamed email_old:
    # column 2 is under no name shown, and email_old (which may be it) is unknown to it.
    numbered(t, (1, "id"), (2, "archived"), (3, "email"), (4, "secret"))
    with pytest.raises(PermanentError, match="column 2 is named archived in the catalog now"):
        b.relation(rel("id", "email_old", "email"))
    # Dropped since: the same.
    numbered(t, (1, "id"), (3, "email"), (4, "secret"))
    with pytest.raises(PermanentError, match="column 2 is gone in the catalog now"):
        b.relation(rel("id", "email_old", "email"))


def test_drop_and_add_is_told_apart_by_the_catalog_and_streams_on() -> None:
    t = transforms("app.users.email")
    numbered(t, (1, "id"), (2, "email"), (3, "note"))
    b = builder(t)
    b.relation(rel("id", "email", "note"))
    numbered(t, (1, "id"), (3, "note"), (4, "email"))  # column 2 dropped, 4 added
    b.relation(rel("id", "note", "email"))
    assert insert(b, "1", "n", EMAIL)["new"]["email"] == "REDACTED"
    # the new column is followed by its number from here on
    numbered(t, (1, "id"), (3, "note"), (4, "email_v1"), (5, "email"))
    with pytest.raises(PermanentError, match="column 4 is now named email_v1"):
        b.relation(rel("id", "note", "email_v1", "email"))
