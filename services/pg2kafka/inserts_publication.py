"""The insert-only publication of ``filters.keyless_tables=inserts`` (V017): init creates
it next to the main publication and registers it on the main publication's row of
``_walcast.publications``; ``_walcast.publish_table`` (and through it the DDL trigger)
puts the matching tables without a replica identity in it; tear-down drops it."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from services.pg2kafka.init_report import InitReport
from services.pg2kafka.settings import Pg2KafkaSettings, inserts_publication


def sync_inserts_publication(
    conn: psycopg.Connection[tuple[Any, ...]], settings: Pg2KafkaSettings, report: InitReport
) -> None:
    """The insert-only publication (``filters.keyless_tables=inserts``, V017): created
    (``publish = 'insert, truncate'``) and registered on the main publication's row, so
    that ``_walcast.publish_table`` and the DDL trigger put keyless tables in it. Tables
    the filters no longer match leave it here; :func:`sync_publication` then moves each
    matching table in or out through ``publish_table``. Under ``skip`` / ``full_identity``
    an existing one is emptied by ``publish_table`` but kept (a running pg2kafka names it
    in START_REPLICATION; tear-down drops it). Runs inside sync_publication's transaction,
    after the main row is written; before V017 (no ``inserts_publication`` column) it does
    nothing."""
    pub = settings.replication.publication
    ins = inserts_publication(pub)
    has_column = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = '_walcast.publications'::regclass"
        " AND attname = 'inserts_publication' AND NOT attisdropped"
    ).fetchone()
    if has_column is None:
        return
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [ins]).fetchone()
    if settings.filters.keyless_tables != "inserts":
        if exists is None:
            conn.execute(
                "UPDATE _walcast.publications SET inserts_publication = NULL"
                " WHERE publication = %s",
                [pub],
            )
        return
    if exists is None:
        conn.execute(
            sql.SQL(
                "CREATE PUBLICATION {} WITH (publish = 'insert, truncate',"
                " publish_via_partition_root = true)"
            ).format(sql.Identifier(ins))
        )
        report.created.append(f"publication {ins} (insert-only: tables without a key)")
    else:
        report.existing.append(f"publication {ins}")
    conn.execute(
        "UPDATE _walcast.publications SET inserts_publication = %s WHERE publication = %s",
        [ins, pub],
    )
    gone = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_publication_rel pr"
        " JOIN pg_catalog.pg_publication pp ON pp.oid = pr.prpubid"
        " JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE pp.pubname = %s AND NOT _walcast.table_matches(%s, n.nspname, c.relname)",
        [ins, pub],
    ).fetchall()
    if gone:  # the filters changed
        conn.execute(
            sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                sql.Identifier(ins), sql.SQL(", ").join(sql.Identifier(s, t) for s, t in gone)
            )
        )


def registered_inserts_publication(
    conn: psycopg.Connection[tuple[Any, ...]], publication: str
) -> str | None:
    """The insert-only publication registered on ``publication``'s row, or None (no row,
    none registered, or a schema from before V017: read through ``to_jsonb`` so that a
    missing column is not an error)."""
    if conn.execute("SELECT to_regclass('_walcast.publications')").fetchone() == (None,):
        return None
    row = conn.execute(
        "SELECT to_jsonb(p) ->> 'inserts_publication' FROM _walcast.publications p"
        " WHERE p.publication = %s",
        [publication],
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def drop_inserts_publication(
    conn: psycopg.Connection[tuple[Any, ...]], publication: str
) -> list[str]:
    """Tear-down: drop the insert-only publication of ``publication`` — the one registered
    on its row, else the one its name derives to when that exists. Returns what was
    removed. Call before the main publication's row is deleted."""
    name = registered_inserts_publication(conn, publication) or inserts_publication(publication)
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [name]).fetchone() is None:
        return []
    conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name)))
    return [f"publication {name}"]


def report_appended(
    report: InitReport, publication: str, appended: list[str], streamed: bool
) -> None:
    """Init's report of the tables that joined the insert-only publication; a warning
    when the slot already existed (``streamed``): the rows already in them are not
    brought across."""
    pub = publication
    if not appended:
        return
    shown = ", ".join(appended[:20]) + (
        f" and {len(appended) - 20} more" if len(appended) > 20 else ""
    )
    report.created.append(
        f"{len(appended)} table(s) without a primary key or replica identity in"
        f" insert-only publication {inserts_publication(pub)} (inserts and truncates"
        f" stream; UPDATE and DELETE are not streamed): {shown}"
    )
    if streamed:
        # Their rows from before were never streamed, and a table without a key has
        # no key ranges for an incremental snapshot to read.
        report.warnings.append(
            f"{len(appended)} table(s) joined insert-only publication"
            f" {inserts_publication(pub)} after the slot was created: their new inserts"
            f" stream, the rows already in them do not (add a primary key to have them"
            f" snapshotted): {shown}"
        )
