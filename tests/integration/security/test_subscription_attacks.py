"""Each attack a security review showed against subscriptions, run as a NOSUPERUSER author
with only the documented grants. Every one must fail with a clear error and leave no side
effect: no role change, no file, no leaked row, no event carrying protected data."""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests.integration.security.conftest import Role, SecurityDb

_keys = itertools.count()


def subscribe(db: SecurityDb, role: Role, **cols: Any) -> str:
    row = {
        "key": f"k{next(_keys)}-{uuid.uuid4().hex[:6]}",
        "stream_id": db.stream,
        "operation": "INSERT",
        "schema_name": "app",
        "table_name": "users",
        **cols,
    }
    names = ", ".join(row)
    marks = ", ".join(["%s"] * len(row))
    values = [
        Jsonb(v) if isinstance(v, (dict, list)) and k != "column_names" else v
        for k, v in row.items()
    ]
    db.sql(role, f"INSERT INTO _walcast.subscriptions ({names}) VALUES ({marks})", values)
    return str(row["key"])


@pytest.fixture(autouse=True)
def clean(secdb: SecurityDb) -> None:
    secdb.sql(None, "DELETE FROM _walcast.subscriptions")
    secdb.sql(None, "DELETE FROM app.users")
    secdb.sql(None, "DELETE FROM _walcast.events")
    secdb.sql(None, "DELETE FROM _walcast.subscription_errors")


def no_escalation(db: SecurityDb) -> None:
    assert not db.is_superuser(db.author)
    assert not db.is_superuser(db.app)
    assert not db.is_superuser(db.owner)


def author_function(db: SecurityDb) -> tuple[str, str]:
    """(name, argument types) of the one author expression function (_walcast_sub.w_<h>)."""
    ((name, argtypes),) = db.sql(
        None,
        "SELECT proname, pg_get_function_identity_arguments(oid) FROM pg_proc"
        " WHERE pronamespace = '_walcast_sub'::regnamespace AND proname LIKE 'w\\_%%'",
    )
    return str(name), str(argtypes)


def rejected(db: SecurityDb, match: str, **cols: Any) -> str:
    with pytest.raises(psycopg.Error, match=match) as info:
        subscribe(db, db.author, **cols)
    no_escalation(db)
    assert db.sql(None, "SELECT count(*) FROM _walcast.subscriptions") == [(0,)]
    return str(info.value)


# -- set-up as documented ------------------------------------------------------------------


def test_init_ran_as_a_nosuperuser_owner_with_the_documented_grants(secdb: SecurityDb) -> None:
    assert not secdb.is_superuser(secdb.owner)
    created = " ".join(secdb.init_report.created)
    assert "migration V007__subscription_privileges" in created
    assert f"slot {secdb.settings.replication.slot}" in created
    assert f"publication {secdb.settings.subscriptions.publication}" in created
    # A NOSUPERUSER owner can neither install DDL capture nor revoke
    # pg_logical_emit_message from PUBLIC: init says both (forged messages are ignored).
    assert secdb.init_report.warnings == [
        "DDL capture off (the owner is not a superuser)",
        "pg_logical_emit_message is executable by PUBLIC (forged messages are ignored;"
        " a superuser can revoke it: docs/security.md)",
    ]
    owners = secdb.sql(
        None,
        "SELECT DISTINCT nspowner::regrole::text FROM pg_namespace"
        " WHERE nspname IN ('_walcast', '_walcast_sub')",
    )
    assert owners == [(secdb.owner.name,)]
    tables = secdb.sql(
        None,
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1",
        [secdb.settings.replication.publication],
    )
    assert tables == [("secrets",), ("users",)]


def test_nothing_in_walcast_is_executable_by_public(secdb: SecurityDb) -> None:
    public = secdb.sql(
        None,
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace IN ('_walcast'::regnamespace, '_walcast_sub'::regnamespace)"
        " AND (p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a"
        " WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE'))",
    )
    assert public == []
    # The application role: no walcast function, not even the schema.
    for call in (
        "SELECT _walcast.set_subscriptions(1, '{}')",
        "SELECT _walcast.maintain_partitions(0, 1)",
        "SELECT _walcast.generate_trigger('app', 'users', 'INSERT')",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            secdb.sql(secdb.app, call)


def test_the_application_needs_no_grant_to_write_a_subscribed_table(secdb: SecurityDb) -> None:
    key = subscribe(secdb, secdb.author, column_names=["id", "email"], when_clause="new.v > 0")
    secdb.sql(secdb.app, "INSERT INTO app.users VALUES (1, 'a@x', 100, 1), (2, 'b@x', 200, 0)")
    (event,) = secdb.events()
    assert event["tg_name"] == key
    assert event["new"] == {"id": 1, "email": "a@x"}


# -- code injection through subscription fields --------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "evil\rALTER ROLE wsec SUPERUSER; --",
        "evil\n$walcast$; ALTER ROLE x SUPERUSER; $walcast$",
        'it\'s "quoted" $$ and %s %I %L',
    ],
)
def test_a_key_is_data_never_code(secdb: SecurityDb, key: str) -> None:
    subscribe(secdb, secdb.author, key=key.replace("wsec", secdb.author.name), column_names=["id"])
    secdb.sql(secdb.app, "INSERT INTO app.users VALUES (1, 'a@x', 1, 1)")
    (event,) = secdb.events()
    assert event["tg_name"] == key.replace("wsec", secdb.author.name)
    no_escalation(secdb)
    # In the generated code the key stands only as one quoted literal, never as code or
    # inside a comment.
    definition, literal = secdb.sql(
        None,
        "SELECT prosrc, quote_literal(%s) FROM pg_proc WHERE proname IN"
        " (SELECT function_name FROM _walcast.generated_triggers)",
        [event["tg_name"]],
    )[0]
    assert literal in definition
    assert "ALTER ROLE" not in definition.replace(literal, "")
    assert "--" not in definition.replace(literal, "")


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("when_clause", "true; ALTER ROLE {author} SUPERUSER"),
        ("when_clause", "true)::boolean; ALTER ROLE {author} SUPERUSER; SELECT (true"),
        ("when_clause", "true) THEN NULL; END IF; ALTER ROLE {author} SUPERUSER; IF (true"),
        ("when_clause", "true --\r) OR (true"),
        ("when_clause", "true /* comment */"),
        ("when_clause", "$walcast$ || (SELECT 1) || $walcast$ = ''"),
        ("expression", "1; COPY (SELECT 1) TO PROGRAM 'touch {file}'"),
        ("expression", "$$x$$"),
        ("expression", "(SELECT 1))"),
        ("expression", "E'\\''; ALTER ROLE {author} SUPERUSER; SELECT '"),
    ],
)
def test_expressions_are_single_expressions(
    secdb: SecurityDb, field: str, text: str, tmp_path: Any
) -> None:
    marker = tmp_path / "pwned"
    text = text.format(author=secdb.author.name, file=marker)
    cols: dict[str, Any] = {"column_names": ["id"]} | (
        {"when_clause": text}
        if field == "when_clause"
        else {"payload_extensions": [{"json_path": "x", "expression": text}]}
    )
    message = rejected(secdb, "is not a single SQL expression|invalid", **cols)
    assert "subscription k" in message
    assert not marker.exists()
    assert not os.path.exists(str(marker))


def test_a_validation_error_leaks_no_protected_row(secdb: SecurityDb) -> None:
    message = rejected(
        secdb,
        "permission denied",
        column_names=["id"],
        when_clause="(SELECT rolpassword FROM pg_authid WHERE rolpassword IS NOT NULL"
        " LIMIT 1)::int > 0",
    )
    assert "SCRAM" not in message
    assert "md5" not in message
    message = rejected(
        secdb,
        "permission denied",
        column_names=["id"],
        when_clause="(SELECT secret FROM app.secrets LIMIT 1)::int > 0",
    )
    assert "the-secret-row" not in message


# -- authorisation -------------------------------------------------------------------------


def test_a_subscription_streams_only_what_its_author_may_read(secdb: SecurityDb) -> None:
    rejected(secdb, "may not SELECT from app.secrets", table_name="secrets")
    rejected(secdb, "may not SELECT from app.users")  # whole rows: salary is not readable
    rejected(secdb, r"may not SELECT column\(s\) \{salary\}", column_names=["id", "salary"])
    rejected(
        secdb,
        "does not exist or its author may not SELECT it",
        column_names=["id"],
        when_clause="new.salary > 0",
    )
    # What the author may read works, and whole-row references see only that.
    subscribe(
        secdb,
        secdb.author,
        column_names=["id", "email"],
        payload_extensions=[{"json_path": "row", "expression": "to_jsonb(new)"}],
    )
    secdb.sql(secdb.app, "INSERT INTO app.users VALUES (1, 'a@x', 12345, 7)")
    (event,) = secdb.events()
    assert event["row"] == {"id": 1, "email": "a@x", "v": 7}
    assert "12345" not in str(event)


def test_payload_expressions_run_as_their_author_not_the_owner(secdb: SecurityDb) -> None:
    rejected(
        secdb,
        "permission denied",
        column_names=["id"],
        payload_extensions=[
            {"json_path": "roles", "expression": "(SELECT string_agg(rolname, ',') FROM pg_authid)"}
        ],
    )
    subscribe(
        secdb,
        secdb.author,
        column_names=["id"],
        payload_extensions=[{"json_path": "who", "expression": "current_user"}],
    )
    secdb.sql(secdb.app, "INSERT INTO app.users VALUES (1, 'a@x', 1, 1)")
    (event,) = secdb.events()
    assert event["who"] == secdb.author.name


def test_an_author_who_turns_their_function_into_invoker_gains_nothing(secdb: SecurityDb) -> None:
    key = subscribe(
        secdb,
        secdb.author,
        column_names=["id"],
        payload_extensions=[{"json_path": "who", "expression": "current_user"}],
    )
    fn, argtypes = author_function(secdb)
    # Run as whoever calls it, and try to escalate, write and replace the shim.
    secdb.sql(
        secdb.author,
        f"CREATE OR REPLACE FUNCTION _walcast_sub.{fn}({argtypes}) RETURNS jsonb"
        " LANGUAGE plpgsql SECURITY INVOKER AS $body$ BEGIN"
        f" BEGIN ALTER ROLE {secdb.author.name} SUPERUSER; EXCEPTION WHEN OTHERS THEN NULL; END;"
        " BEGIN INSERT INTO _walcast.events (payload, stream_id) VALUES ('{}', 1);"
        " EXCEPTION WHEN OTHERS THEN NULL; END;"
        " RETURN jsonb_build_array(current_user || ':' ||"
        " current_setting('transaction_read_only')); END $body$",
    )
    secdb.sql(secdb.app, "INSERT INTO app.users VALUES (1, 'a@x', 1, 1)")
    (event,) = secdb.events()
    assert event["tg_name"] == key
    assert event["who"] == "walcast_sandbox:on"  # no privileges, and read-only
    no_escalation(secdb)
    # The sandbox owns the shim that calls this function; running as the sandbox, try to
    # replace the shim with one that is not read-only: refused, the event quarantined.
    shim = "c_" + fn[2:]
    secdb.sql(
        secdb.author,
        f"CREATE OR REPLACE FUNCTION _walcast_sub.{fn}({argtypes}) RETURNS jsonb"
        " LANGUAGE plpgsql SECURITY INVOKER AS $body$ BEGIN"
        f" EXECUTE 'CREATE OR REPLACE FUNCTION _walcast_sub.{shim}({argtypes})"
        " RETURNS jsonb LANGUAGE sql RETURN NULL';"
        " RETURN '[]'; END $body$",
    )
    secdb.sql(secdb.app, "INSERT INTO app.users VALUES (2, 'b@x', 1, 1)")
    assert len(secdb.events()) == 1
    ((err_key, sqlstate, _),) = secdb.errors()
    assert (err_key, sqlstate) == (key, "25006")  # read_only_sql_transaction


def test_an_expression_is_lexed_the_same_whatever_the_writing_session_sets(
    secdb: SecurityDb,
) -> None:
    """The author's function (PL/pgSQL) is compiled by the first session that calls it:
    under that session's standard_conforming_strings a backslash would end a string
    early, and text checked as one literal could be read as code. The function pins the
    rules the text was checked under."""
    key = subscribe(
        secdb,
        secdb.author,
        column_names=["id"],
        payload_extensions=[
            {"json_path": "a", "expression": "'x\\' || ';'"},
            {"json_path": "b", "expression": "E'\\\\' || 'y'"},
        ],
    )
    with psycopg.connect(secdb.dsn(secdb.app), autocommit=True) as c:
        c.execute("SET standard_conforming_strings = off")  # a new session: compiles it
        c.execute("INSERT INTO app.users VALUES (1, 'a@x', 1, 1)")
    (event,) = secdb.events()
    assert (event["tg_name"], event["a"], event["b"]) == (key, "x\\;", "\\y")
    assert secdb.errors() == []
    no_escalation(secdb)


def test_maintain_partitions_is_the_owners_and_bounded(secdb: SecurityDb) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        secdb.sql(secdb.author, "SELECT _walcast.maintain_partitions(0, 1)")
    for args in ("0, 0", "-1, 7", "7, 100000", "7, 7, now() + interval '30 days'"):
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            secdb.sql(secdb.owner, f"SELECT _walcast.maintain_partitions({args})")


# -- a failing subscription never fails the application's commit ---------------------------


def test_division_by_zero_in_a_when_clause_is_quarantined(secdb: SecurityDb) -> None:
    bad = subscribe(secdb, secdb.author, column_names=["id"], when_clause="10 / new.v > 1")
    good = subscribe(secdb, secdb.author, column_names=["id"])
    with psycopg.connect(secdb.dsn(secdb.app), autocommit=True) as c:
        notices: list[str] = []
        c.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
        c.execute("INSERT INTO app.users VALUES (1, 'a@x', 1, 0)")  # commits
    assert secdb.sql(None, "SELECT count(*) FROM app.users") == [(1,)]
    assert [e["tg_name"] for e in secdb.events()] == [good]
    assert secdb.errors() == [(bad, "22012", "division by zero")]
    assert any(bad in n and "division by zero" in n for n in notices)
    row = secdb.sql(None, "SELECT new_row FROM _walcast.subscription_errors")[0][0]
    assert row["id"] == 1  # the event can be rebuilt


@pytest.mark.parametrize(
    ("statement", "sqlstate"),
    [("ASSERT false", "P0004"), ("RAISE EXCEPTION USING ERRCODE = 'query_canceled'", "57014")],
)
def test_an_error_when_others_misses_is_quarantined_too(
    secdb: SecurityDb, statement: str, sqlstate: str
) -> None:
    """assert_failure and query_canceled are not matched by WHEN OTHERS: an author whose
    function raised one of them failed every commit on the table."""
    bad = subscribe(secdb, secdb.author, column_names=["id"], when_clause="new.v > 0")
    good = subscribe(secdb, secdb.author, column_names=["id"])
    fn, argtypes = author_function(secdb)
    secdb.sql(
        secdb.author,
        f"CREATE OR REPLACE FUNCTION _walcast_sub.{fn}({argtypes}) RETURNS jsonb"
        f" LANGUAGE plpgsql SECURITY DEFINER AS $body$ BEGIN {statement}; RETURN '[]'; END $body$",
    )
    secdb.sql(secdb.app, "INSERT INTO app.users VALUES (1, 'a@x', 1, 1)")  # commits
    assert secdb.sql(None, "SELECT count(*) FROM app.users") == [(1,)]
    assert [e["tg_name"] for e in secdb.events()] == [good]
    assert [(k, code) for k, code, _ in secdb.errors()] == [(bad, sqlstate)]


@pytest.mark.parametrize(
    "ddl",
    [
        "ALTER TABLE app.users DROP COLUMN email",
        "ALTER TABLE app.users RENAME COLUMN email TO mail",
    ],
)
def test_a_projected_column_dropped_or_renamed_is_quarantined(secdb: SecurityDb, ddl: str) -> None:
    secdb.sql(None, "DROP TABLE IF EXISTS app.users CASCADE")
    secdb.sql(
        secdb.app, "CREATE TABLE app.users (id int PRIMARY KEY, email text, salary int, v int)"
    )
    secdb.sql(
        secdb.app,
        f"GRANT SELECT (id, email, v) ON app.users TO {secdb.author.name}",
    )
    projected = subscribe(secdb, secdb.author, column_names=["id", "email"])
    in_expression = subscribe(
        secdb, secdb.author, column_names=["id"], when_clause="new.email IS NOT NULL"
    )
    untouched = subscribe(secdb, secdb.author, column_names=["id", "v"])
    secdb.sql(secdb.app, ddl)
    secdb.sql(secdb.app, "INSERT INTO app.users (id, v) VALUES (1, 2)")  # commits
    assert secdb.sql(None, "SELECT count(*) FROM app.users") == [(1,)]
    assert [e["tg_name"] for e in secdb.events()] == [untouched]
    assert sorted(k for k, _, _ in secdb.errors()) == sorted([projected, in_expression])
