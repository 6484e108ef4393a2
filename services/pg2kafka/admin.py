"""``init``, ``tear-down`` and ``status``: the Postgres objects pg2kafka streams from.

``init`` is idempotent: it creates what is missing (publication, slot) and leaves what
exists alone. ``tear-down`` removes exactly what ``init`` created. Both run on an ordinary
connection as a role that may create publications (owner of the tables, or superuser for
``FOR ALL TABLES``) and has REPLICATION.

(A little over 600 lines: the snapshot commands' few functions stay beside ``status``,
which reports them; the insert-only publication has its own module.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from services.pg2kafka.init_report import InitReport
from services.pg2kafka.inserts_publication import (
    drop_inserts_publication,
    report_appended,
    sync_inserts_publication,
)
from services.pg2kafka.settings import Pg2KafkaSettings, inserts_publication
from shared.errors import PermanentError
from shared.kafka import ensure_topic
from shared.migrations import migrate
from shared.retry import call_with_retry

log = logging.getLogger(__name__)


def _connect(settings: Pg2KafkaSettings) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(settings.postgres.conninfo(), autocommit=True)


@contextmanager
def _streams_lock(conn: psycopg.Connection[tuple[Any, ...]]) -> Iterator[None]:
    """One ``init`` or ``tear-down`` of this database's streams at a time (a session-level
    advisory lock): the DDL capture goes with the last stream's tear-down, and must not
    go between another stream's ``init`` installing it and that stream's registration."""
    conn.execute("SELECT pg_catalog.pg_advisory_lock(hashtext('walcast.streams'))")
    try:
        yield
    finally:
        if not conn.broken:  # a lost connection released it (and its error is the news)
            conn.execute("SELECT pg_catalog.pg_advisory_unlock(hashtext('walcast.streams'))")


def check_server(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Fail fast, with the fix, on a server that cannot stream logical changes."""
    row = conn.execute("SHOW wal_level").fetchone()
    if row is None or row[0] != "logical":
        raise PermanentError(
            f"wal_level is {row[0] if row else 'unknown'!r}, logical replication needs 'logical'",
            hint="set wal_level = logical in postgresql.conf and restart Postgres",
        )
    row = conn.execute(
        "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if not row or not row[0]:
        raise PermanentError(
            "the role has no REPLICATION attribute",
            hint="ALTER ROLE <user> REPLICATION (or connect as a role that has it)",
        )


def install_ddl_capture(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """Create the DDL capture's event triggers when missing (True if it did). V001 made
    them once, but a tear-down of the database's last CDC stream drops them while the
    schema (and its migration ledger) may stay for other streams' data: every ``init``
    puts them back. Only a superuser may (docs/security.md); for anyone else this does
    nothing, and init warns."""
    row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if not (row and row[0]) or ddl_capture_installed(conn):
        return False
    with conn.transaction():
        for name, event, function in (
            ("walcast_ddl_command_end", "ddl_command_end", "_walcast.on_ddl_command_end"),
            ("walcast_sql_drop", "sql_drop", "_walcast.on_sql_drop"),
        ):
            if not conn.execute(
                "SELECT 1 FROM pg_event_trigger WHERE evtname = %s", [name]
            ).fetchone():
                conn.execute(
                    sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}()").format(
                        sql.Identifier(name),
                        sql.SQL(event),
                        sql.SQL(function),
                    )
                )
    return True


def ddl_capture_installed(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_event_trigger"
        " WHERE evtname IN ('walcast_ddl_command_end', 'walcast_sql_drop') AND evtenabled <> 'D'"
    ).fetchone()
    return row is not None and row[0] == 2


def public_message_writers(conn: psycopg.Connection[tuple[Any, ...]]) -> list[str]:
    """The signatures of ``pg_logical_emit_message`` that PUBLIC may still execute (V004
    revokes them where the migrating role may: a superuser)."""
    rows = conn.execute(
        "SELECT p.oid::pg_catalog.regprocedure::text FROM pg_catalog.pg_proc p"
        " WHERE p.proname = 'pg_logical_emit_message'"
        " AND p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace"
        " AND pg_catalog.has_function_privilege('public', p.oid, 'EXECUTE') ORDER BY 1"
    ).fetchall()
    return [str(r[0]) for r in rows]


def init(settings: Pg2KafkaSettings, *, migrations_only: bool = False) -> InitReport:
    """Apply the SQL migrations, then (unless ``migrations_only``) make sure the
    publication matches the filters, the slot exists and, if configured, the topic."""
    rep = settings.replication
    report = InitReport()
    with _connect(settings) as conn, ExitStack() as locked:
        locked.enter_context(_streams_lock(conn))  # until the stream is registered
        check_server(conn)
        for name in migrate(conn):
            report.created.append(f"migration {name}")
        if install_ddl_capture(conn):
            report.created.append("DDL capture (event triggers)")
        if not ddl_capture_installed(conn):
            log.warning(
                "DDL capture is off: its event triggers need a superuser owner "
                "(docs/security.md); schema changes reach consumers with the next row only"
            )
            report.warnings.append("DDL capture off (the owner is not a superuser)")
        open_to_public = public_message_writers(conn)
        if open_to_public:
            log.warning(
                "%s executable by PUBLIC: any role can write logical messages into the"
                " WAL. pg2kafka ignores those walcast did not sign, but other readers of this"
                " database's WAL may not; a superuser closes it with: REVOKE EXECUTE ON"
                " FUNCTION %s FROM PUBLIC; GRANT EXECUTE ON FUNCTION %s TO %s",
                " and ".join(open_to_public),
                ", ".join(open_to_public),
                ", ".join(open_to_public),
                settings.postgres.user,
            )
            report.warnings.append(
                "pg_logical_emit_message is executable by PUBLIC (forged messages are ignored;"
                " a superuser can revoke it: docs/security.md)"
            )
        if migrations_only:
            return report
        sync_publication(conn, settings, report)
        locked.close()  # creating a slot waits for running transactions: not under the lock
        if settings.snapshot.mode == "never" or slot_exists(conn, rep.slot):
            ensure_slot(conn, rep.slot, settings.postgres.database, report)
        else:
            # The slot must be created with an exported snapshot that lives only as long
            # as its connection: `run` creates it and reads the tables under it.
            report.later.append(
                f"slot {rep.slot}: created by `pg2kafka run`, which first takes the initial"
                f" snapshot (snapshot.mode={settings.snapshot.mode})"
            )
        if settings.subscriptions.enabled:
            init_subscriptions(conn, settings, report)
    prod = settings.producer
    if prod.create_topic:
        topics = [prod.topic]
        if settings.subscriptions.enabled:
            topics.append(settings.subscriptions.topic)
        for topic in topics:
            if call_with_retry(
                partial(
                    ensure_topic,
                    settings.kafka.client_config(),
                    topic,
                    prod.topic_partitions,
                    prod.topic_replication_factor,
                    # A broker's default (~1 MB) would refuse large rows.
                    {"max.message.bytes": str(prod.max_message_bytes)},
                ),
                policy=settings.retry,
                what=f"create topic {topic}",
            ):
                report.created.append(f"topic {topic}")
            else:
                report.existing.append(f"topic {topic}")
    return report


def slot_exists(conn: psycopg.Connection[tuple[Any, ...]], slot: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    return row is not None


def ensure_slot(
    conn: psycopg.Connection[tuple[Any, ...]], slot: str, database: str, report: InitReport
) -> None:
    row = conn.execute(
        "SELECT plugin, database FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    if row is None:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
        report.created.append(f"slot {slot}")
    elif row[0] != "pgoutput" or row[1] != database:
        raise PermanentError(
            f"slot {slot!r} exists for plugin {row[0]!r} in database {row[1]!r}",
            hint="choose another slot name or drop that slot",
        )
    else:
        report.existing.append(f"slot {slot}")


def init_subscriptions(
    conn: psycopg.Connection[tuple[Any, ...]], settings: Pg2KafkaSettings, report: InitReport
) -> None:
    """The stream's row, its publication (only its own events), its slot, the partitions."""
    sub = settings.subscriptions
    conn.execute(
        "INSERT INTO _walcast.streams (id) VALUES (%s) ON CONFLICT DO NOTHING", [sub.stream_id]
    )
    if conn.execute(
        "SELECT 1 FROM pg_publication WHERE pubname = %s", [sub.publication]
    ).fetchone():
        report.existing.append(f"publication {sub.publication}")
    else:
        conn.execute(
            sql.SQL(
                "CREATE PUBLICATION {} FOR TABLE _walcast.events WHERE (stream_id = {})"
                " WITH (publish = 'insert', publish_via_partition_root = true)"
            ).format(sql.Identifier(sub.publication), sql.Literal(sub.stream_id))
        )
        report.created.append(f"publication {sub.publication}")
    ensure_slot(conn, sub.slot, settings.postgres.database, report)
    done = maintain_partitions(conn, settings)
    report.created.extend(f"partition {name}" for name in done.get("created", []))


def maintain_partitions(
    conn: psycopg.Connection[tuple[Any, ...]], settings: Pg2KafkaSettings
) -> dict[str, Any]:
    """Run the partition maintenance once and record when it ran and runs next."""
    sub = settings.subscriptions
    row = conn.execute(
        "SELECT _walcast.maintain_partitions(%s, %s)", [sub.premake_days, sub.retention_days]
    ).fetchone()
    conn.execute(
        "UPDATE _walcast.streams SET last_maintenance_at = now(),"
        " next_maintenance_at = now() + make_interval(secs => %s) WHERE id = %s",
        [sub.maintenance_interval_s, sub.stream_id],
    )
    result: dict[str, Any] = row[0] if row else {}
    return result


def sync_publication(
    conn: psycopg.Connection[tuple[Any, ...]], settings: Pg2KafkaSettings, report: InitReport
) -> None:
    """Register the filters and make the publication list exactly the matching tables
    that have a replica identity (V008): Postgres refuses UPDATE and DELETE on a published
    table without one, so a ``FOR ALL TABLES`` publication (which an earlier init made,
    and which is converted here) broke the application's statements on keyless tables.
    ``filters.keyless_tables`` decides what happens to those: they join the insert-only
    publication (``inserts``, V017: :func:`sync_inserts_publication`), are left out
    (``skip``, reported here, logged and counted by the service) or made ``REPLICA
    IDENTITY FULL`` (``full_identity``). The DDL trigger keeps the lists in step with
    later DDL. Idempotent; one transaction.
    """
    pub = settings.replication.publication
    filters = settings.filters
    ident = sql.Identifier(pub)
    with conn.transaction():
        conn.execute(
            "INSERT INTO _walcast.publications"
            " (publication, include_patterns, exclude_patterns, all_tables, keyless)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (publication) DO UPDATE SET"
            " include_patterns = EXCLUDED.include_patterns,"
            " exclude_patterns = EXCLUDED.exclude_patterns, all_tables = EXCLUDED.all_tables,"
            " keyless = EXCLUDED.keyless",
            [pub, filters.include, filters.exclude, filters.all_tables, filters.keyless_tables],
        )
        sync_inserts_publication(conn, settings, report)
        row = conn.execute(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", [pub]
        ).fetchone()
        if row is not None and row[0]:
            # Dropped and created again in this transaction: a decoder reading the slot
            # sees the old publication before this commit and the new one after it.
            conn.execute(sql.SQL("DROP PUBLICATION {}").format(ident))
            report.warnings.append(
                f"publication {pub} converted from FOR ALL TABLES to a table list"
                " (tables without a replica identity are handled by filters.keyless_tables)"
            )
            row = None
        if row is None:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} WITH (publish_via_partition_root = true)").format(
                    ident
                )
            )
            report.created.append(f"publication {pub}")
        else:
            report.existing.append(f"publication {pub}")
        matching = conn.execute(
            "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
            " AND c.relpersistence = 'p'"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema', '_walcast')"
            " AND n.nspname NOT LIKE 'pg\\_%%'"
            " AND _walcast.table_matches(%s, n.nspname, c.relname) ORDER BY 2, 3",
            [pub],
        ).fetchall()
        wanted = {int(oid) for oid, _, _ in matching}
        listed = conn.execute(
            "SELECT pr.prrelid, n.nspname, c.relname FROM pg_catalog.pg_publication_rel pr"
            " JOIN pg_catalog.pg_publication pp ON pp.oid = pr.prpubid"
            " JOIN pg_catalog.pg_class c ON c.oid = pr.prrelid"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE pp.pubname = %s",
            [pub],
        ).fetchall()
        gone = [(s, t) for oid, s, t in listed if int(oid) not in wanted]
        if gone:  # the filters changed
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                    ident, sql.SQL(", ").join(sql.Identifier(s, t) for s, t in gone)
                )
            )
        skipped: list[str] = []
        appended: list[str] = []
        streamed = slot_exists(conn, settings.replication.slot)
        for oid, schema, table in matching:
            try:
                outcome = conn.execute(
                    "SELECT _walcast.publish_table(%s, %s)", [pub, oid]
                ).fetchone()
            except psycopg.errors.InsufficientPrivilege as exc:
                raise PermanentError(
                    f"cannot publish {schema}.{table}: {exc.diag.message_primary}",
                    hint="publishing a table needs its ownership: make the role init runs as"
                    " a member of the table's owner, or leave the table out with"
                    " filters.include / filters.exclude",
                ) from exc
            if outcome is not None and outcome[0].endswith("added") and streamed:
                # The filters grew: the table's rows were never streamed.
                conn.execute(
                    "INSERT INTO _walcast.snapshot_requests (publication, schema_name,"
                    " table_name, reason) VALUES (%s, %s, %s, 'joined the publication (init)')",
                    [pub, schema, table],
                )
                report.created.append(f"snapshot request for {schema}.{table}")
            if outcome is not None and outcome[0] in ("skipped", "removed"):
                skipped.append(f"{schema}.{table}")
            elif outcome is not None and outcome[0].startswith("full_identity"):
                report.created.append(f"REPLICA IDENTITY FULL on {schema}.{table}")
            elif outcome is not None and outcome[0] == "inserts":
                appended.append(f"{schema}.{table}")
    report_appended(report, pub, appended, streamed)
    if skipped:
        shown = ", ".join(skipped[:20]) + (
            f" and {len(skipped) - 20} more" if len(skipped) > 20 else ""
        )
        report.warnings.append(
            f"{len(skipped)} table(s) without a primary key or replica identity left out of"
            f" publication {pub} (their changes are not streamed; add a primary key, or set"
            f" filters.keyless_tables=full_identity): {shown}"
        )
        log.warning("tables without a replica identity left out: %s", shown)


def tear_down(settings: Pg2KafkaSettings) -> list[str]:
    """Drop the slot and the publication (the Kafka topic is kept: it holds data)."""
    rep = settings.replication
    removed = []
    with _connect(settings) as conn, _streams_lock(conn):
        if settings.subscriptions.enabled:
            sub = settings.subscriptions
            removed.extend(_drop_stream(conn, sub.slot, sub.publication))
        active = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", [rep.slot]
        ).fetchone()
        if active is not None:
            if active[0] is not None:
                raise PermanentError(
                    f"slot {rep.slot!r} is being streamed by pid {active[0]}",
                    hint="stop pg2kafka before tear-down",
                )
            conn.execute("SELECT pg_drop_replication_slot(%s)", [rep.slot])
            removed.append(f"slot {rep.slot}")
        if conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", [rep.publication]
        ).fetchone():
            conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(rep.publication)))
            removed.append(f"publication {rep.publication}")
        removed.extend(drop_inserts_publication(conn, rep.publication))
        if conn.execute("SELECT to_regclass('_walcast.publications')").fetchone() != (None,):
            conn.execute(
                "DELETE FROM _walcast.publications WHERE publication = %s", [rep.publication]
            )
            if conn.execute("SELECT to_regclass('_walcast.table_floors')").fetchone() != (None,):
                conn.execute("DELETE FROM _walcast.table_floors WHERE slot = %s", [rep.slot])
            if conn.execute("SELECT to_regclass('_walcast.transform_stops')").fetchone() != (None,):
                conn.execute("DELETE FROM _walcast.transform_stops WHERE slot = %s", [rep.slot])
            # The DDL capture serves every CDC stream of this database: it goes with the
            # last one. The schema also holds the subscription streams' subscriptions,
            # events and replay queues, which are not this stream's to remove: it goes
            # only when nothing of anyone's is left in it.
            if conn.execute("SELECT count(*) FROM _walcast.publications").fetchone() == (0,):
                conn.execute("DROP EVENT TRIGGER IF EXISTS walcast_ddl_command_end")
                conn.execute("DROP EVENT TRIGGER IF EXISTS walcast_sql_drop")
                removed.append("DDL capture (event triggers)")
                if _walcast_unused(conn):
                    conn.execute("DROP SCHEMA IF EXISTS _walcast_sub CASCADE")
                    conn.execute("DROP SCHEMA _walcast CASCADE")
                    removed.append("schema _walcast (nothing of any stream left in it)")
                else:
                    log.info("schema _walcast kept: it holds other streams' data")
    return removed


def _walcast_unused(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """No stream, subscription, event or queued replay left in ``_walcast``."""
    row = conn.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM _walcast.streams)"
        " AND NOT EXISTS (SELECT 1 FROM _walcast.subscriptions)"
        " AND NOT EXISTS (SELECT 1 FROM _walcast.events)"
        " AND NOT EXISTS (SELECT 1 FROM _walcast.replay_queue)"
    ).fetchone()
    return bool(row and row[0])


def subscriptions_status(
    conn: psycopg.Connection[tuple[Any, ...]], settings: Pg2KafkaSettings
) -> dict[str, Any]:
    sub = settings.subscriptions
    parts = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = '_walcast.events'::regclass ORDER BY 1"
    ).fetchall()
    row = conn.execute(
        "SELECT last_maintenance_at::text, next_maintenance_at::text, failover_checkpoint,"
        " delivered_snapshot_at::text FROM _walcast.streams WHERE id = %s",
        [sub.stream_id],
    ).fetchone()
    return {
        "stream_id": sub.stream_id,
        "slot": sub.slot,
        "topic": sub.topic,
        "partitions": [p[0] for p in parts],
        "last_maintenance_at": row[0] if row else None,
        "next_maintenance_at": row[1] if row else None,
        "failover_checkpoint": row[2] if row else None,
        "delivered_snapshot_at": row[3] if row else None,
        "subscriptions": conn.execute(
            "SELECT count(*) FROM _walcast.subscriptions WHERE stream_id = %s", [sub.stream_id]
        ).fetchone()[0],  # type: ignore[index]
    }


def _drop_stream(conn: psycopg.Connection[tuple[Any, ...]], slot: str, pub: str) -> list[str]:
    removed = []
    active = conn.execute(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", [slot]
    ).fetchone()
    if active is not None:
        if active[0] is not None:
            raise PermanentError(
                f"slot {slot!r} is being streamed by pid {active[0]}",
                hint="stop pg2kafka before tear-down",
            )
        conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        removed.append(f"slot {slot}")
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [pub]).fetchone():
        conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(pub)))
        removed.append(f"publication {pub}")
    return removed


def snapshot_status(settings: Pg2KafkaSettings, limit: int = 5) -> list[dict[str, Any]]:
    """The slot's latest snapshots, newest first, each with its tables' progress: rows
    done / estimated, chunks done / total, rows per second and ETA for a running one."""
    from services.pg2kafka.snapshots.store import snapshot_progress

    out = []
    with _connect(settings) as conn:
        if not _snapshots_installed(conn):
            return []
        runs = conn.execute(
            "SELECT id, kind, state, version::text, requested_by, created_at, finished_at,"
            " error FROM _walcast.snapshots WHERE slot = %s ORDER BY id DESC LIMIT %s",
            [settings.replication.slot, limit],
        ).fetchall()
        for run_id, kind, state, version, by, created, finished, error in runs:
            tables = snapshot_progress(conn, run_id)
            for t in tables:
                rate = t["rows"] / t["seconds"] if t["seconds"] else None
                left = (t["estimate"] or 0) - t["rows"]
                t["rows_per_s"] = None if rate is None else round(rate)
                t["eta_s"] = (
                    round(left / rate) if rate and left > 0 and t["state"] == "running" else None
                )
            out.append(
                {
                    "id": run_id, "kind": kind, "state": state, "version": version,
                    "requested_by": by, "created_at": str(created),
                    "finished_at": None if finished is None else str(finished),
                    "error": error, "tables": tables,
                }
            )  # fmt: skip
    return out


def snapshot_request(settings: Pg2KafkaSettings, tables: list[str]) -> list[int]:
    """Ask for incremental snapshots of ``tables`` (``schema.table``; ``table`` means
    ``public.table``): rows in the signal table ``_walcast.snapshot_requests``, taken by
    the running pg2kafka within seconds. Each table must be in the publication."""
    pub = settings.replication.publication
    ids = []
    with _connect(settings) as conn:
        for name in tables:
            schema, _, table = name.rpartition(".")
            schema = schema or "public"
            listed = conn.execute(
                "SELECT 1 FROM pg_catalog.pg_publication_tables WHERE pubname = %s"
                " AND schemaname = %s AND tablename = %s",
                [pub, schema, table],
            ).fetchone()
            if (
                listed is None
                and conn.execute(
                    "SELECT 1 FROM pg_catalog.pg_publication_tables WHERE pubname = %s"
                    " AND schemaname = %s AND tablename = %s",
                    [inserts_publication(pub), schema, table],
                ).fetchone()
            ):
                raise PermanentError(
                    f"{schema}.{table} has no primary key or replica identity: it streams as"
                    f" an insert-only table (publication {inserts_publication(pub)}), and an"
                    " incremental snapshot reads a table by key ranges",
                    hint="add a primary key: the table then moves to the main publication and"
                    " is snapshotted automatically",
                )
            if listed is None:
                raise PermanentError(
                    f"{schema}.{table} is not in publication {pub}",
                    hint="check the name; a table must match filters.include and have a primary"
                    " key or replica identity (then run `pg2kafka init`)",
                )
            row = conn.execute(
                "INSERT INTO _walcast.snapshot_requests (publication, schema_name, table_name,"
                " reason) VALUES (%s, %s, %s, 'requested') RETURNING id",
                [pub, schema, table],
            ).fetchone()
            assert row is not None
            ids.append(int(row[0]))
    return ids


def snapshot_cancel(settings: Pg2KafkaSettings, run_id: int | None = None) -> list[int]:
    """Mark the slot's running snapshot (or run ``run_id``) cancelled: its readers stop
    within a second and pg2kafka goes on streaming. Rows not yet read are not sent; the
    sinks keep what they had of them (a later snapshot brings them)."""
    with _connect(settings) as conn:
        if not _snapshots_installed(conn):
            return []
        rows = conn.execute(
            "UPDATE _walcast.snapshots SET state = 'cancelled', finished_at = now(),"
            " error = 'cancelled by an operator' WHERE slot = %s AND state = 'running'"
            " AND (%s::bigint IS NULL OR id = %s) RETURNING id",
            [settings.replication.slot, run_id, run_id],
        ).fetchall()
    return [int(r[0]) for r in rows]


def _snapshots_installed(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    row = conn.execute("SELECT to_regclass('_walcast.snapshots') IS NOT NULL").fetchone()
    return bool(row and row[0])


def status(settings: Pg2KafkaSettings) -> dict[str, Any]:
    rep = settings.replication
    out: dict[str, Any] = {"slot": rep.slot, "publication": rep.publication}
    with _connect(settings) as conn:
        row = conn.execute(
            "SELECT confirmed_flush_lsn::text, active,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint"
            " FROM pg_replication_slots WHERE slot_name = %s",
            [rep.slot],
        ).fetchone()
        if row is None:
            out["slot_exists"] = False
        else:
            out.update(slot_exists=True, confirmed_lsn=row[0], active=row[1], lag_bytes=row[2])
        tables = conn.execute(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables"
            " WHERE pubname = %s ORDER BY 1",
            [rep.publication],
        ).fetchall()
        out["publication_tables"] = [t[0] for t in tables]
        out["ddl_capture"] = ddl_capture_installed(conn)
        if _snapshots_installed(conn):
            last = conn.execute(
                "SELECT id, kind, state FROM _walcast.snapshots WHERE slot = %s"
                " ORDER BY id DESC LIMIT 1",
                [rep.slot],
            ).fetchone()
            out["snapshot"] = None if last is None else f"{last[1]} #{last[0]}: {last[2]}"
        if settings.subscriptions.enabled:
            out["subscription_events"] = subscriptions_status(conn, settings)
    try:
        from confluent_kafka.admin import AdminClient

        md = AdminClient(settings.kafka.client_config()).list_topics(timeout=5)
        out["kafka_reachable"] = True
        out["topic_exists"] = settings.producer.topic in md.topics
    except Exception as exc:  # noqa: BLE001 - status reports, it does not fail
        out["kafka_reachable"] = False
        out["kafka_error"] = str(exc)
    return out
