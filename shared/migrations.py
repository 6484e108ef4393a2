"""Applies the versioned SQL in ``sql/<component>/`` (package data: ``sql/pg2kafka/`` in the
source database, ``sql/kafka2postgres/`` in a target), each file once.

Files are named ``V<nnn>__<name>.sql`` and are idempotent on their own; the ledger
``_walcast.schema_migrations`` records what ran, with a checksum, so a file edited after it
was applied is reported instead of silently skipped. Concurrent ``init`` runs serialise on
a transaction-level advisory lock.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

from shared.errors import PermanentError

_NAME = re.compile(r"^V(\d{3,})__([a-z0-9_]+)\.sql$")
_LOCK_KEY = 0x77616C63  # "walc"

# Checksums of earlier texts of a migration that were edited in a way that changes nothing
# where they already ran. An applied migration is never run again; its ledger row is moved
# to the current checksum. Each entry says why the edit was safe.
_SUPERSEDED: dict[tuple[str, int], frozenset[str]] = {
    # V001 creates its event triggers only when run by a superuser (a non-superuser owner
    # cannot, and must not). Where it already ran, a superuser ran it.
    ("pg2kafka", 1): frozenset({"ec9b05c60951ed97"}),
}


@dataclass(frozen=True)
class Migration:
    component: str
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]


def available(component: str) -> list[Migration]:
    folder = resources.files("sql") / component
    found = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append(Migration(component, int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(found, key=lambda mig: mig.version)


def migrate(
    conn: psycopg.Connection[Any], component: str = "pg2kafka", up_to: int | None = None
) -> list[str]:
    """Apply what is missing (up to version ``up_to``, when given: tests of an upgrade
    start from an older schema); return the names applied.

    Runs as the role that will own the walcast objects. A superuser also gets DDL capture
    (event triggers); any other owner needs the grants in docs/security.md.
    """
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        conn.execute(
            "CREATE SCHEMA IF NOT EXISTS _walcast;"
            " CREATE TABLE IF NOT EXISTS _walcast.schema_migrations ("
            " component text NOT NULL, version int NOT NULL, name text NOT NULL,"
            " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (component, version))"
        )
        done = {
            int(r[0]): str(r[1])
            for r in conn.execute(
                "SELECT version, checksum FROM _walcast.schema_migrations WHERE component = %s",
                [component],
            ).fetchall()
        }
        for mig in available(component):
            if up_to is not None and mig.version > up_to:
                break
            if mig.version in done:
                if done[mig.version] in _SUPERSEDED.get((component, mig.version), ()):
                    conn.execute(
                        "UPDATE _walcast.schema_migrations SET checksum = %s"
                        " WHERE component = %s AND version = %s",
                        [mig.checksum, component, mig.version],
                    )
                elif done[mig.version] != mig.checksum:
                    raise PermanentError(
                        f"migration {component} V{mig.version:03d} changed after it was applied",
                        hint="add a new migration file instead of editing an applied one",
                    )
                continue
            conn.execute(mig.sql.encode())  # a trusted file, no parameters
            conn.execute(
                "INSERT INTO _walcast.schema_migrations (component, version, name, checksum)"
                " VALUES (%s, %s, %s, %s)",
                [component, mig.version, mig.name, mig.checksum],
            )
            applied_now.append(f"V{mig.version:03d}__{mig.name}")
    return applied_now
