"""A database set up the way docs/security.md says, for attacking it.

A fresh database per module. A superuser does only what the docs say a DBA does once
(roles, CREATE on the database, membership in walcast_sandbox); everything else —
migrations, publications, slots, topics — is pg2kafka's own ``init`` run as a NOSUPERUSER
owner. The author holds only walcast_admin plus SELECT on what it may read; the
application owns its tables and has no grant on anything of walcast's.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg import sql

from services.pg2kafka import admin
from services.pg2kafka.init_report import InitReport
from services.pg2kafka.settings import Pg2KafkaSettings
from tests.integration.conftest import make_settings


@dataclass
class Role:
    name: str
    password: str


@dataclass
class SecurityDb:
    host: str
    port: str
    database: str
    superuser_dsn: str
    owner: Role
    author: Role
    app: Role
    settings: Pg2KafkaSettings
    init_report: InitReport
    stream: int

    def dsn(self, role: Role | None = None) -> str:
        if role is None:
            return self.superuser_dsn
        return f"postgresql://{role.name}:{role.password}@{self.host}:{self.port}/{self.database}"

    def sql(
        self, role: Role | None, statement: str, params: list[Any] | None = None
    ) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn(role), autocommit=True) as c:
            cur = c.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def is_superuser(self, role: Role) -> bool:
        rows = self.sql(None, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role.name])
        return bool(rows[0][0])

    def events(self) -> list[dict[str, Any]]:
        rows = self.sql(
            None,
            "SELECT payload FROM _walcast.events WHERE stream_id = %s ORDER BY id",
            [self.stream],
        )
        return [r[0] for r in rows]

    def errors(self) -> list[tuple[str, str, str]]:
        return [
            (r[0], r[1], r[2])
            for r in self.sql(
                None, "SELECT key, sqlstate, message FROM _walcast.subscription_errors ORDER BY id"
            )
        ]


def _role(prefix: str, tag: str) -> Role:
    return Role(f"{prefix}_{tag}", secrets.token_hex(12))


@pytest.fixture(scope="module")
def secdb(stack_env: dict[str, str]) -> Iterator[SecurityDb]:
    tag = uuid.uuid4().hex[:8]
    database = f"walcast_sec_{tag}"
    owner, author, app = _role("wsec_owner", tag), _role("wsec_author", tag), _role("wsec_app", tag)
    su = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(su, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        # What a DBA does once (docs/security.md, "Grants").
        for role, extra in ((owner, "REPLICATION"), (author, ""), (app, "")):
            c.execute(
                sql.SQL(
                    "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB {} PASSWORD {}"
                ).format(sql.Identifier(role.name), sql.SQL(extra), sql.Literal(role.password))
            )
        for r in ("walcast_sandbox", "walcast_admin"):
            c.execute(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = %s) THEN"
                f" CREATE ROLE {r} NOLOGIN; END IF;"
                # a test beside this one may create it at the same moment
                " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$".replace(
                    "%s", f"'{r}'"
                )
            )
        c.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(owner.name)
            )
        )
        c.execute(sql.SQL("GRANT walcast_sandbox TO {}").format(sql.Identifier(owner.name)))
        c.execute(sql.SQL("GRANT walcast_admin TO {}").format(sql.Identifier(author.name)))
        # The owner publishes the application's tables: Postgres requires their ownership.
        c.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(app.name), sql.Identifier(owner.name))
        )
        c.execute(
            sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(database), sql.Identifier(app.name)
            )
        )
    host, port = stack_env["WALCAST_PG_HOST"], stack_env["WALCAST_PG_PORT"]
    db_dsn = f"postgresql://{stack_env['WALCAST_PG_USER']}:{stack_env['WALCAST_PG_PASSWORD']}@{host}:{port}/{database}"
    # The application's schema and tables, as the application.
    app_dsn = f"postgresql://{app.name}:{app.password}@{host}:{port}/{database}"
    with psycopg.connect(app_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA app")
        c.execute("CREATE TABLE app.users (id int PRIMARY KEY, email text, salary int, v int)")
        c.execute("CREATE TABLE app.secrets (id int PRIMARY KEY, secret text)")
        c.execute("INSERT INTO app.secrets VALUES (1, 'the-secret-row')")
        c.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {}").format(sql.Identifier(author.name)))
        # The author may read id, email and v of users; nothing of secrets.
        c.execute(
            sql.SQL("GRANT SELECT (id, email, v) ON app.users TO {}").format(
                sql.Identifier(author.name)
            )
        )
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    name = f"wsec_{tag}"
    stream = 4242
    settings = make_settings(
        env_file,
        name,
        postgres={"user": owner.name, "password": owner.password, "database": database},
        filters={"include": ["app.*"]},
        subscriptions={
            "enabled": True,
            "stream_id": stream,
            "slot": f"{name}_ev",
            "publication": f"{name}_ev",
            "topic": f"{name}.events",
        },
    )
    report = admin.init(settings)
    db = SecurityDb(host, port, database, db_dsn, owner, author, app, settings, report, stream)
    try:
        yield db
    finally:
        try:
            admin.tear_down(settings)
        finally:
            client = AdminClient(settings.kafka.client_config())
            for topic in (settings.producer.topic, settings.subscriptions.topic):
                if topic in client.list_topics(timeout=10).topics:
                    client.delete_topics([topic])[topic].result(30)
            with psycopg.connect(su, autocommit=True) as c:
                c.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(database)
                    )
                )
                for role in (owner, author, app):
                    c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role.name)))
