"""The initial snapshot (before streaming, as leader), the run loop every snapshot shares,
and what a new source means for snapshots."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from services.pg2kafka.filters import TableFilter
from services.pg2kafka.output import output_format
from services.pg2kafka.postgres import Catalog
from services.pg2kafka.replication import (
    Identity,
    created_slot_snapshot,
    format_lsn,
    identify_system,
)
from services.pg2kafka.settings import Pg2KafkaSettings, inserts_publication
from services.pg2kafka.snapshots.chunks import (
    Job,
    TableSpec,
    describe_tables,
    plan_chunks,
)
from services.pg2kafka.snapshots.progress import Progress
from services.pg2kafka.snapshots.readers import Readers, SnapshotProducer, close_tables
from services.pg2kafka.snapshots.store import PostgresSnapshotStore
from services.pg2kafka.transforms import from_settings, unique_key
from services.pg2kafka.types import TypeRegistry
from shared.avro import Shape
from shared.contract.event import SnapshotInfo
from shared.errors import PermanentError

if TYPE_CHECKING:  # a reader process needs no metrics (prometheus_client: 12 MB)
    from services.pg2kafka.metrics import Metrics

log = logging.getLogger(__name__)


def run_job(
    settings: Pg2KafkaSettings,
    metrics: Metrics,
    stop: threading.Event,
    job: Job,
    tables: list[TableSpec],
    snapshot_name: str | None,
    tick: Callable[[], None] = lambda: None,
) -> str:
    """Read the job's pending chunks with ``snapshot.workers`` readers; returns the job's
    end state (``done``, ``cancelled``) or ``stopped``; raises a reader's failure."""
    readers = Readers(settings, job, tables, snapshot_name, stop)
    store = PostgresSnapshotStore(settings.postgres.conninfo())
    progress = Progress(settings, metrics, job)
    cancelled = False
    try:
        readers.start()
        while readers.alive():
            tick()
            readers.join(1.0)
            if store.state(job) == "cancelled":
                cancelled = True
                readers.halt()
            if stop.is_set():
                readers.halt()
            progress.report(store.progress(job))
            readers.raise_failure()
        readers.raise_failure()
        if cancelled:
            log.warning("snapshot %d cancelled: its remaining chunks are not read", job.id)
            return "cancelled"
        if stop.is_set():
            return "stopped"
        # Tables with nothing left to read whose end marker a dead run did not send.
        close_tables(settings, store, job, readers.producer)
        progress.report(store.progress(job), final=True)
        store.finish(job, "done")
        return "done"
    finally:
        readers.close()
        store.close()


def initial_snapshot(
    settings: Pg2KafkaSettings,
    metrics: Metrics,
    stop: threading.Event,
    tick: Callable[[], None] = lambda: None,
    epoch: int = 0,
) -> str:
    """Before streaming, as leader: create the slot with an exported snapshot and read
    every published table under it, or finish an interrupted initial snapshot. Returns
    ``done`` (stream now), ``cancelled`` (stream now; the rest was not read), ``stopped``
    or ``none`` (the slot existed and no initial snapshot is owed)."""
    rep = settings.replication
    conninfo = settings.postgres.conninfo()
    table_filter = TableFilter(settings.filters.include, settings.filters.exclude)
    store = PostgresSnapshotStore(conninfo, epoch)
    try:
        encoding = store.conn.execute("SHOW server_encoding").fetchone()
        if encoding is not None and encoding[0] == "SQL_ASCII":
            raise PermanentError(
                "snapshots of a SQL_ASCII database are not supported yet (its text has no"
                " encoding to read it by)",
                hint="set snapshot.mode=never: pg2kafka then streams changes only",
            )
        job = store.unfinished(rep.slot, "initial")
        if store.slot_exists(rep.slot):
            if job is None:
                return "none"
            requeued = store.requeue_running(job)
            log.info(
                "resuming initial snapshot %d of slot %s (%d chunks were being read); the"
                " exported snapshot ended with the previous run, so the rest is read fresh"
                " at the same version (the slot has not moved: docs/snapshots.md)",
                job.id, rep.slot, requeued,
            )  # fmt: skip
            tables = describe_tables(
                store.conn, rep.publication, table_filter,
                also=(inserts_publication(rep.publication),),
            )  # fmt: skip
            return run_job(settings, metrics, stop, job, tables, None, tick)
        if job is not None:
            store.finish(job, "failed", "its slot was dropped before it finished")
        system = identify_system(conninfo)
        with created_slot_snapshot(conninfo, rep.slot) as (point, exported):
            version = store.restart_lsn(rep.slot) - 1
            tables = describe_tables(
                store.conn, rep.publication, table_filter,
                also=(inserts_publication(rep.publication),),
            )  # fmt: skip
            pages = settings.snapshot.chunk_pages
            job = store.create(rep.slot, "initial", version, tables,
                               lambda t: plan_chunks(t, pages), "slot created", system)  # fmt: skip
            log.info(
                "created slot %s at %s with an exported snapshot: initial snapshot %d of %d"
                " table(s), ~%d rows, version %s",
                rep.slot, point, job.id, len(tables),
                sum(t.rows_estimate or 0 for t in tables), format_lsn(version),
            )  # fmt: skip
            # Requests written before the slot existed (the DDL trigger's, init's) are
            # covered: the exported snapshot sees every row committed before it.
            store.conn.execute(
                "UPDATE _walcast.snapshot_requests SET taken_at = now(), taken_by = %s"
                " WHERE publication = %s AND taken_at IS NULL",
                [job.id, rep.publication],
            )
            start_markers(settings, job, tables, system)
            return run_job(settings, metrics, stop, job, tables, exported, tick)
    finally:
        store.close()


def start_markers(
    settings: Pg2KafkaSettings, job: Job, tables: list[TableSpec], system: Identity
) -> None:
    """Each table's start marker, with the source the rows are read from and the table's
    schema as a DDL event gives it (``columns``, ``primary_key``; as the transform rules
    leave it): a sink that makes tables makes this one exactly, though no DDL event ever
    described it (docs/events.md, "Snapshots")."""
    schemas = described(settings, tables)
    producer = SnapshotProducer(settings, settings.producer.max_inflight_bytes, job.epoch)
    # A marker carries no column types: an encoding with a schema per table needs its shape.
    catalog = None if producer.values.writes_json else Catalog(settings.postgres.conninfo())
    transforms = from_settings(settings.transforms)
    try:
        for t in tables:
            shape: Shape | None = None
            if catalog is not None:  # Avro: the marker is written with the table's schema
                types = TypeRegistry(catalog.type_info)
                plan = (
                    transforms.plan(t.relation, unique_key(t.relation, catalog.primary_key))
                    if transforms is not None
                    else None
                )  # the schema the rules leave
                cols = (plan.relation if plan is not None else t.relation).columns
                shape = ({c.name: types.name(c.type_oid) for c in cols},
                         [c.name for c in cols if c.is_key])  # fmt: skip
            source = {"system": system[0], "timeline": system[1]}
            info: SnapshotInfo = {"id": job.id, "phase": "start", "source": source}
            schema = schemas.get(t.relation.oid)
            if schema is not None:
                columns = schema.get("columns") or []
                if transforms is not None:
                    columns = transforms.ddl_columns(t.schema, t.name, columns)
                info["columns"] = columns
                info["primary_key"] = schema.get("primary_key") or []
            producer.marker(settings.postgres.database, t.schema, t.name, job.version, info,
                            shape)  # fmt: skip
        producer.flush()
    finally:
        producer.close()
        if catalog is not None:
            catalog.close()


def described(settings: Pg2KafkaSettings, tables: list[TableSpec]) -> dict[int, dict[str, Any]]:
    """Each table's schema by its oid, as ``_walcast.table_schema`` (the DDL capture's)
    reads it from the catalog now."""
    with psycopg.connect(settings.postgres.conninfo(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT r, _walcast.table_schema(r) FROM unnest(%s::oid[]) AS r",
            [[t.relation.oid for t in tables]],
        ).fetchall()
    return {int(oid): dict(schema) for oid, schema in rows if schema is not None}


def after_source_change(settings: Pg2KafkaSettings, reason: str) -> str:
    """A new source (services/pg2kafka/source.py): every published table is read again,
    so that the end markers remove from the sinks the rows the new source does not have.
    Unfinished runs end (their rows carry the old epoch: finishing them would remove what
    they read before); when the slot came along, every table is requested as an
    incremental snapshot; without a slot, the initial snapshot that follows reads them
    all. Returns what happens, for the log."""
    rep = settings.replication
    with psycopg.connect(settings.postgres.conninfo(), autocommit=True) as conn:
        slot = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", [rep.slot]
        ).fetchone()
        try:
            with conn.transaction():
                conn.execute(
                    "UPDATE _walcast.snapshots SET state = 'failed', finished_at = now(),"
                    " error = %s WHERE slot = %s AND state = 'running'",
                    [f"the source changed: {reason}"[:1000], rep.slot],
                )
                if settings.snapshot.mode == "never":
                    return (
                        "snapshot.mode is never: the sinks keep the rows of the old source"
                        " that this one does not have, until they change or a table is"
                        " snapshotted"
                    )
                if slot is None:
                    return "no slot on this server: the initial snapshot reads every table"
                if not output_format(settings).source_epochs:
                    return (
                        "producer.format=debezium carries no source epoch: the sinks order"
                        " its records by position alone, and the old source's rows at"
                        " higher positions would outrank what a snapshot reads now; to"
                        " read every table again, empty the sinks, then pg2kafka"
                        " tear-down and run (a new initial snapshot)"
                    )
                tables = conn.execute(
                    "INSERT INTO _walcast.snapshot_requests (publication, schema_name,"
                    " table_name, reason) SELECT pubname, schemaname, tablename,"
                    " 'source changed' FROM pg_catalog.pg_publication_tables"
                    " WHERE pubname = %s RETURNING id",
                    [rep.publication],
                ).fetchall()
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable) as exc:
            return (
                f"the role may not use the snapshot tables ({str(exc).strip()}): no table is"
                " snapshotted; the sinks keep the old source's rows this one lacks"
            )
    return f"slot {rep.slot} came along: {len(tables)} table(s) requested as incremental snapshots"


def drop_slot(settings: Pg2KafkaSettings) -> None:
    """``initial_only``: the copy is made; a slot nobody streams would hold WAL forever."""
    with psycopg.connect(settings.postgres.conninfo(), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_catalog.pg_drop_replication_slot(slot_name)"
            " FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
            [settings.replication.slot],
        )
    log.info("initial_only: snapshot done, slot %s dropped", settings.replication.slot)
