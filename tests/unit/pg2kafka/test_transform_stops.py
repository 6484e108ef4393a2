"""A transform stop outlives the process (issue 36, finding 5): the shape check hands the
columns that lost their rule to the recorder — by table oid and attribute number — before
it raises; each session's first shape waits for the recorded stops to be settled; at
start-up a record is deleted, kept or refuses the start (services/pg2kafka/
transform_stops.py). Against Postgres and Kafka: the last test of
tests/integration/pg2kafka/test_transforms_renames.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.settings import TransformSettings
from services.pg2kafka.transform_shapes import Stop
from services.pg2kafka.transform_stops import Record, clear_statement, exists, refusal, verdict
from services.pg2kafka.transforms import Transforms
from services.pg2kafka.types import TypeRegistry
from shared.errors import PermanentError

OID = 16390
STREAMED = TableFilter(["app.*"], [])


def transforms(*columns: str) -> Transforms:
    rules = [{"column": c, "action": "redact"} for c in columns]
    return Transforms(TransformSettings(rules=rules))  # type: ignore[arg-type]


def recording(t: Transforms) -> list[Stop]:
    stops: list[Stop] = []
    t.shapes.recorder = stops.extend
    return stops


def rel(*names: str, table: str = "users", oid: int = OID) -> pg.Relation:
    return pg.Relation(
        oid, "app", table, "d", tuple(pg.Column(n, 25, -1, n == "id") for n in names)
    )


def builder(t: Transforms, commit_lsn: int = 6000) -> EventBuilder:
    b = EventBuilder("db", TypeRegistry(), transforms=t)
    b.begin(pg.Begin(commit_lsn, 1_700_000_000_000_000, 7))
    return b


def ddl(names: dict[str, int], oid: int | None = OID) -> pg.Message:
    cols = [{"name": n, "type": "text", "sql_type": "text", "nullable": True, "num": i}
            for n, i in names.items()]  # fmt: skip
    table: dict[str, Any] = {"schema": "app", "table": "users", "columns": cols,
                             "primary_key": ["id"]}  # fmt: skip
    if oid is not None:
        table["oid"] = oid
    payload = {"tag": "ALTER TABLE", "statement": "...", "tables": [table]}
    return pg.Message(True, 1, "walcast.ddl", orjson.dumps(payload))


def catalog(t: Transforms, names: dict[str, int]) -> None:
    rows = [(OID, "app", "users", n, i) for n, i in names.items()]
    t.shapes.remember_catalog(rows, STREAMED, lsn=5000)


def test_a_rename_under_a_wildcard_is_recorded_by_attribute_number_before_the_stop() -> None:
    """The gap: ``*mail*`` still matches mailing_opt after email became contact, so only
    the recorded stop keeps a restart from streaming contact in the clear."""
    t = transforms("app.users.*mail*")
    stops = recording(t)
    catalog(t, {"id": 1, "email": 2, "mailing_opt": 3})
    with pytest.raises(PermanentError, match=r"app\.users\.email \(rule 'app\.users\.\*mail\*'\)"):
        builder(t).relation(rel("id", "contact", "mailing_opt"))
    assert stops == [Stop(OID, 2, "app", "users", "email", "app.users.*mail*", "app", "users")]


def test_a_ddl_event_numbers_the_columns_of_a_table_first_seen_in_the_stream() -> None:
    t = transforms("app.users.*mail*")
    stops = recording(t)
    b = builder(t)
    b.ddl(ddl({"id": 1, "email": 2, "mailing_opt": 3}), 5100)  # e.g. CREATE TABLE
    with pytest.raises(PermanentError):
        b.ddl(ddl({"id": 1, "mailing_opt": 3, "contact": 4}), 5200)  # dropped, then added
    # attnum 2 is the email column: at start-up it is found dropped, and the record goes
    assert [(s.oid, s.attnum, s.column) for s in stops] == [(OID, 2, "email")]


def test_a_relation_message_keeps_the_numbers_of_the_names_it_shares() -> None:
    """Relation messages name columns only: a shape learned from the catalog keeps its
    numbers through a Relation message that adds a column, for the rename after it."""
    t = transforms("app.users.*mail*")
    stops = recording(t)
    catalog(t, {"id": 1, "email": 2, "mailing_opt": 3})
    b = builder(t)
    b.relation(rel("id", "email", "mailing_opt", "note"))
    with pytest.raises(PermanentError):
        b.relation(rel("id", "contact", "mailing_opt", "note"))
    assert [(s.attnum, s.column, s.now_column) for s in stops] == [(2, "email", None)]


def test_without_numbers_every_candidate_name_is_recorded_for_the_catalog_to_number() -> None:
    """A table first seen in a Relation message (created after start-up, no DDL capture):
    names cannot tell which new column the lost one became; each is recorded."""
    t = transforms("app.users.*mail*")
    stops = recording(t)
    b = builder(t)
    b.relation(rel("id", "email", "mailing_opt"))
    with pytest.raises(PermanentError):
        b.relation(rel("id", "contact", "mailing_opt", "note"))
    assert [(s.oid, s.attnum, s.column, s.now_column) for s in stops] == [
        (OID, None, "email", "contact"),
        (OID, None, "email", "note"),
    ]
    # a table renamed away from its rule: the column kept its name
    t = transforms("app.users.email")
    stops = recording(t)
    b = builder(t)
    b.relation(rel("id", "email"))
    with pytest.raises(PermanentError, match=r"as app\.customers"):
        b.relation(rel("id", "email", table="customers"))
    assert [(s.attnum, s.now_table, s.now_column) for s in stops] == [(None, "customers", "email")]


def test_a_stop_that_cannot_be_recorded_is_not_passed() -> None:
    """The recorder's failure is raised in place of the stop (a retriable database error
    for one): the stream neither passes the change nor ends as if it were recorded."""
    t = transforms("app.users.email")
    catalog(t, {"id": 1, "email": 2})

    def unreachable(stops: list[Stop]) -> None:
        raise ConnectionError("database away")

    t.shapes.recorder = unreachable
    b = builder(t)
    with pytest.raises(ConnectionError):
        b.relation(rel("id", "contact"))
    with pytest.raises(ConnectionError):  # nothing was remembered: the same stop again
        b.relation(rel("id", "contact"))


def test_each_session_waits_for_recorded_stops_before_its_first_shape() -> None:
    """A standby that checked at its start, before the stop was recorded, takes over:
    its first shape re-checks the records, once per session; the subscription stream's
    internal relations are not held up."""
    t = transforms("app.users.email")
    calls: list[int] = []
    pending = [True]

    def guard() -> None:
        calls.append(1)
        if pending[0]:
            raise PermanentError("a column lost its transform rule")

    t.shapes.guard = guard
    b = builder(t)
    b.relation(pg.Relation(1, "_walcast", "events", "d", (pg.Column("id", 25, -1, True),)))
    assert calls == []
    with pytest.raises(PermanentError, match="lost its transform rule"):
        b.relation(rel("id", "email"))
    pending[0] = False
    b = builder(t)
    b.relation(rel("id", "email"))
    b.relation(rel("id", "email", table="orders", oid=OID + 1))
    assert len(calls) == 2


def record(now: tuple[str, str, str] | None) -> Record:
    s, t, c = now if now is not None else (None, None, None)
    return Record(OID, 2, "app", "users", "email", "app.users.*mail*", "2024-05-01 10:00:00+00",
                  s, t, c)  # fmt: skip


@pytest.mark.parametrize(
    ("now", "rules", "expected"),
    [
        # still there under its new name, no rule covers it: refused (the gap)
        (("app", "users", "contact"), ("app.users.*mail*",), "refuse"),
        # a rule covers the new name: settled
        (("app", "users", "contact"), ("app.users.*mail*", "app.users.contact"), "delete"),
        # the table renamed and a rule follows it
        (("app", "people", "email"), ("app.*.email",), "delete"),
        # the table renamed to a name no rule covers
        (("app", "people", "email"), ("app.users.*mail*",), "refuse"),
        # dropped (or its table): settled
        (None, ("app.users.*mail*",), "delete"),
        # moved out of what the filters stream: nothing of it is sent, kept for later
        (("archive", "users", "contact"), ("app.users.*mail*",), "keep"),
    ],
)
def test_the_start_up_decision_for_a_recorded_stop(
    now: tuple[str, str, str] | None, rules: tuple[str, ...], expected: str
) -> None:
    assert verdict(record(now), transforms(*rules).rule_for, STREAMED) == expected


def test_the_refusal_names_both_names_the_rule_and_how_to_let_it_through() -> None:
    message = str(refusal("walcast_o'k", [record(("app", "users", "contact"))]))
    assert "app.users.email (rule 'app.users.*mail*'" in message
    assert "is now app.users.contact" in message
    assert "add or adjust a rule in transforms.rules" in message
    statement = clear_statement("walcast_o'k", record(("app", "users", "contact")))
    assert statement in message
    assert statement == (
        "DELETE FROM _walcast.transform_stops WHERE slot = 'walcast_o''k'"
        f" AND table_oid = {OID} AND attnum = 2;"
    )


def test_a_database_without_the_stops_table_is_refused_with_run_init() -> None:
    class Conn:
        def execute(self, query: str, params: list[Any]) -> Any:
            assert params == ["_walcast.transform_stops"]
            return self

        def fetchone(self) -> tuple[None]:
            return (None,)

    with pytest.raises(PermanentError, match="run pg2kafka init"):
        exists(Conn())  # type: ignore[arg-type]
