"""Attacks on pg2kafka itself, on a database set up as docs/security.md says (a
NOSUPERUSER owner that ran ``init``; an application role with no walcast grant).

- **search_path hijack**: a role that may create functions in ``public`` shadows
  catalog functions with more specific signatures (``public.to_json(record)`` beats
  ``pg_catalog.to_json(anyelement)``); nothing of theirs may run in any pg2kafka session.
- **forged logical messages**: any role that may call ``pg_logical_emit_message`` writes
  a ``walcast.ddl`` or ``walcast.snapshot`` message; pg2kafka must act on none of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from services.pg2kafka import admin
from services.pg2kafka.messages import sign
from shared.settings import SAFE_SEARCH_PATH
from tests.integration.conftest import Harness, make_settings, tear_down
from tests.integration.security.conftest import SecurityDb

pytestmark = pytest.mark.integration

MARK = "hijacked_as"

# (signature, SQL expression returning a plausible result, built only from pg_catalog)
SHADOWS: list[tuple[str, str, str]] = [
    ("to_json(r record)", "json", "pg_catalog.json_build_object('{m}', current_user)"),
    ("to_jsonb(r record)", "jsonb", "pg_catalog.jsonb_build_object('{m}', current_user)"),
    ("json_build_array(a text)", "json", "pg_catalog.json_build_array('{m}', current_user)"),
    ("jsonb_build_array(a text)", "jsonb", "pg_catalog.jsonb_build_array('{m}', current_user)"),
    ("json_build_object(a text, b text)", "json",
     "pg_catalog.json_build_object('{m}', current_user)"),
    ("jsonb_build_object(a text, b text)", "jsonb",
     "pg_catalog.jsonb_build_object('{m}', current_user)"),
    ("format(a text, b text)", "text", "'{m}:' || current_user"),
    ("format(a text, b text, c text)", "text", "'{m}:' || current_user"),
    ("concat(a text, b text)", "text", "'{m}:' || current_user"),
    ("concat_ws(a text, b text, c text)", "text", "'{m}:' || current_user"),
]  # fmt: skip


@pytest.fixture(scope="module")
def hijacked(secdb: SecurityDb) -> SecurityDb:
    """``public`` writable by the application (PostgreSQL 14's default, or a database
    owner's), which defines the shadows; each logs its call where it can and returns a
    marker that would show in Kafka."""
    app = sql.Identifier(secdb.app.name)
    secdb.sql(None, sql.SQL("GRANT CREATE, USAGE ON SCHEMA public TO {}").format(app).as_string())
    secdb.sql(None, "CREATE TABLE public.hijack_log (who text, fn text)")
    secdb.sql(None, "GRANT INSERT ON public.hijack_log TO PUBLIC")
    for signature, returns, body in SHADOWS:
        fn = signature.split("(")[0]
        secdb.sql(
            secdb.app,
            f"CREATE FUNCTION public.{signature} RETURNS {returns} LANGUAGE plpgsql AS $f$"
            f" BEGIN BEGIN INSERT INTO public.hijack_log VALUES (current_user, '{fn}');"
            f" EXCEPTION WHEN OTHERS THEN NULL; END;"
            f" RETURN {body.format(m=MARK)}; END $f$",
        )
    # The shadows do win on the default search_path: the test can fail.
    rows = secdb.sql(secdb.owner, "SELECT to_json(ROW(1))::text")
    assert MARK in rows[0][0]
    secdb.sql(None, "TRUNCATE public.hijack_log")
    return secdb


@pytest.fixture
def search_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The search_path of every Postgres session walcast's code opens in this process
    while the test runs (replication sessions included: asked with the simple protocol)."""
    seen: list[str] = []
    real: Callable[..., Any] = psycopg.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        conn = real(*args, **kwargs)
        if sys._getframe(1).f_globals.get("__name__", "").startswith(("services.", "shared.")):
            result = conn.pgconn.exec_(b"SHOW search_path")
            seen.append(result.get_value(0, 0).decode())
        return conn

    monkeypatch.setattr(psycopg, "connect", connect)
    return seen


def _owner_settings(db: SecurityDb, env_file: Path, name: str, **sections: Any) -> Any:
    return make_settings(
        env_file,
        name,
        postgres={"user": db.owner.name, "password": db.owner.password, "database": db.database},
        filters={"include": ["app.*"]},
        **sections,
    )


def test_no_user_function_runs_in_any_pg2kafka_session(
    hijacked: SecurityDb, search_paths: list[str], unique_name: str, env_file: Path
) -> None:
    db = hijacked
    db.sql(db.app, "CREATE TABLE app.orders (id int PRIMARY KEY, note text)")
    db.sql(db.app, "INSERT INTO app.orders SELECT g, 'n' || g FROM generate_series(1, 500) g")
    settings = _owner_settings(
        db, env_file, unique_name, snapshot={"mode": "initial", "workers": 2, "chunk_pages": 1}
    )
    admin.init(settings)
    h = Harness(settings, db.superuser_dsn)
    try:
        h.start()
        h.events(lambda seen: sum(e["op"] == "read" and e["table"] == "orders"
                                  for e in seen) >= 500, timeout=120)  # fmt: skip
        db.sql(db.app, "INSERT INTO app.orders VALUES (1000, 'streamed')")
        h.events(lambda seen: any(e["op"] == "insert" for e in seen))
        admin.snapshot_request(settings, ["app.orders"])  # incremental, while streaming
        h.events(
            lambda seen: (
                sum(e["op"] == "snapshot" and e["snapshot"]["phase"] == "end" for e in seen) >= 2
            ),
            timeout=120,
        )  # initial, incremental
        admin.status(settings)
        admin.snapshot_status(settings)
    finally:
        h.stop()
        tear_down(settings)
    hits = db.sql(None, "SELECT who, fn FROM public.hijack_log")
    assert hits == [], f"user functions ran in pg2kafka's sessions: {hits}"
    leaked = [e for e in h.seen if MARK in orjson.dumps(e).decode()]
    assert leaked == [], f"a shadow's result reached Kafka: {leaked[:2]}"
    assert search_paths, "no session was observed"
    assert set(search_paths) == {"pg_catalog,pg_temp"}, search_paths
    assert SAFE_SEARCH_PATH in settings.postgres.conninfo()


def test_forged_logical_messages_change_nothing(
    hijacked: SecurityDb, unique_name: str, env_file: Path
) -> None:
    """With pg_logical_emit_message still executable by PUBLIC (a NOSUPERUSER owner
    cannot revoke it), the application writes a CREATE TABLE DDL message for a streamed
    table, a low watermark that would open a window for ever, ones signed with a wrong
    key, and real signatures replayed in another transaction or under another prefix: no
    DDL event, no window, each counted."""
    db = hijacked
    assert any("pg_logical_emit_message" in w for w in db.init_report.warnings)
    db.sql(db.app, "CREATE TABLE app.accounts (id int PRIMARY KEY, v int)")
    settings = _owner_settings(db, env_file, unique_name, snapshot={"mode": "never"})
    admin.init(settings)
    h = Harness(settings, db.superuser_dsn)
    try:
        h.start()
        db.sql(db.app, "INSERT INTO app.accounts VALUES (1, 1)")
        h.events(lambda seen: any(e["op"] == "insert" for e in seen))
        ddl = {"tag": "CREATE TABLE", "statement": "CREATE TABLE app.accounts ()",
               "tables": [{"schema": "app", "table": "accounts", "columns": [],
                           "primary_key": []}]}  # fmt: skip
        low = {"run": 1, "schema": "app", "table": "accounts", "chunk": 0, "mark": "low"}
        # The real key, as a role that can read the WAL would learn a signed message:
        # signed for an earlier transaction, replayed in the application's.
        real_key = bytes(db.sql(None, "SELECT key FROM _walcast.message_key")[0][0])
        with psycopg.connect(db.dsn(db.app), autocommit=True) as app, app.transaction():
            xid = int(app.execute("SELECT pg_current_xact_id()::xid::text").fetchone()[0])
            forged = [
                ("walcast.ddl", orjson.dumps(ddl)),
                ("walcast.snapshot", orjson.dumps(low)),
                ("walcast.ddl", sign(b"k" * 32, "walcast.ddl", xid, orjson.dumps(ddl))),
                ("walcast.ddl", b"walcast-sig-v2:" + b"0" * 64 + b":" + orjson.dumps(ddl)),
                ("walcast.ddl", sign(real_key, "walcast.ddl", xid - 7, orjson.dumps(ddl))),
                ("walcast.ddl", sign(real_key, "walcast.snapshot", xid, orjson.dumps(ddl))),
            ]
            for prefix, content in forged:
                app.execute("SELECT pg_logical_emit_message(true, %s, %s::bytea)",
                            [prefix, content])  # fmt: skip
            app.execute("INSERT INTO app.accounts VALUES (2, 2)")
        h.events(lambda seen: any(e["op"] == "insert" and e["new"]["id"] == 2 for e in seen))
        assert [e for e in h.seen if e["op"] == "ddl"] == []
        assert h.service is not None
        metric = h.service.registry.get_sample_value(
            "walcast_pg2kafka_unauthenticated_messages_total"
        )
        assert metric == len(forged)
    finally:
        h.stop()
        tear_down(settings)
