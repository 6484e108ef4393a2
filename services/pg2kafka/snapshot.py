"""Snapshots: the rows tables already hold, into the stream as ``op: read`` events.

(Over 600 lines, kept together for now: the store, the reader processes and the run share
one chunk lifecycle; the split planned is the store (``SnapshotStore``) into its own
module.)

The initial snapshot (``snapshot.mode`` ``initial`` / ``initial_only``) runs when pg2kafka
finds no slot: it creates the slot with an exported snapshot, reads every published
table under that snapshot, and only then starts streaming. A transaction visible in the
exported snapshot is never streamed by the new slot and one not visible always is, so
every row arrives exactly once, as a read row or later as a change; and since streaming
starts only after Kafka acknowledged the whole snapshot, a row's read precedes its
changes in its partition.

The version a read row carries (its ``lsn``) is the slot's ``restart_lsn`` read before the
read, minus one: below every change the read did not see, so such a change wins in every
sink whichever arrives first (the proof: docs/snapshots-design.md). Before streaming
starts the slot does not move, so every chunk of an initial snapshot carries the same
version, also when read again after a restart.

Work is split into chunks: page ranges (``ctid``) of each table, or of each partition
of a partitioned one, ``snapshot.chunk_pages`` pages each, the last open-ended. Readers
(``snapshot.workers`` threads, each with its own connection and producer) claim chunks
from ``_walcast.snapshot_chunks`` (``FOR UPDATE SKIP LOCKED``), so one big table is read
by every reader at once. A chunk is recorded done only after Kafka acknowledged each of
its events (checkpoint last): a run killed at any point resumes at the first unfinished
chunk; the exported snapshot is gone by then, so the rest is read fresh — still exact:
the slot has not moved, every change since its creation is streamed after the snapshot
and wins by version.

Per table, a ``snapshot`` marker with ``phase: start`` goes before its rows and one with
``phase: end`` after them (both carry the table's start version S): at the end marker a
sink removes what it holds of the table with a version below S, i.e. rows that no longer
exist (the end marker of an initial snapshot taken after the slot was lost clears what
was deleted meanwhile).

Row building: a table whose columns are all of types whose JSON Postgres writes exactly
as the stream's conversion does (booleans, integers, text, uuid) has its rows written as
JSON by Postgres (``to_json``), several times faster than converting in Python; any
other table goes through the stream's own converters (:class:`EventBuilder`), from the
same text output pgoutput sends.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder, append_only, iso_utc, set_epoch
from services.pg2kafka.debezium_format import (
    DebeziumRecords,
    SnapshotRead,
    connect_encoder,
    event_encoder,
    too_large,
)
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.postgres import Catalog
from services.pg2kafka.replication import (
    DEBEZIUM_SESSION_OPTIONS,
    SESSION_OPTIONS,
    Identity,
    created_slot_snapshot,
    format_lsn,
    identify_system,
)
from services.pg2kafka.routing import Routing, row_key, table_key
from services.pg2kafka.settings import Pg2KafkaSettings, inserts_publication
from services.pg2kafka.topics import StreamTarget, Topics, producer_config
from services.pg2kafka.transforms import from_settings, unique_key
from services.pg2kafka.types import TypeRegistry
from shared.avro import Shape
from shared.contract.event import EVENT_VERSION, ChangeEvent, SnapshotInfo
from shared.errors import PermanentError, RetriableError, is_retriable, operator_hint
from shared.failpoints import failpoint
from shared.kafka import BulkKafkaSink
from shared.logs import configure_logging

if TYPE_CHECKING:  # a reader process needs no metrics (prometheus_client: 12 MB)
    from services.pg2kafka.metrics import Metrics

log = logging.getLogger(__name__)

# Types whose to_json() is exactly what the stream's conversion makes of their text:
# bool, int8, int2, int4 (JSON literals), name, text, bpchar, varchar, uuid (strings of
# the type's output). Anything else (numeric, floats, dates, bytea, json, arrays, inet's
# netmask, ...) goes through the converters.
PG_JSON_TYPES = frozenset({16, 19, 20, 21, 23, 25, 1042, 1043, 2950})
POLL_EVERY = 1000  # rows between two looks at Kafka's acknowledgements and the stop flag


@dataclass(frozen=True)
class TableSpec:
    """A published table as its events name it, with the relations holding its rows
    (the table itself, or each leaf partition: the publication publishes partitioned
    tables under the root's name)."""

    relation: pg.Relation
    leaves: tuple[tuple[int, int], ...]  # (relation oid, pages now)
    rows_estimate: int | None

    @property
    def schema(self) -> str:
        return self.relation.schema

    @property
    def name(self) -> str:
        return self.relation.table


@dataclass(frozen=True)
class Chunk:
    snapshot_id: int
    schema: str
    table: str
    chunk: int
    relation: int | None
    first_page: int | None
    end_page: int | None
    lower_key: list[str] | None = None
    upper_key: list[str] | None = None
    # Only these keys of the range (each as the events' key, JSON text): the keys of an
    # earlier chunk read again (V019, services/pg2kafka/incremental.py). None: every row.
    only_keys: list[str] | None = None


@dataclass
class Job:
    id: int
    slot: str
    kind: str
    version: int
    state: str
    epoch: int = 0  # the source's epoch its events carry (not stored: the stream's, now)
    started_us: int = 0  # when the run was created (µs since the epoch)


def describe_tables(
    conn: psycopg.Connection[Any],
    publication: str,
    table_filter: TableFilter,
    only: set[tuple[str, str]] | None = None,
    *,
    also: tuple[str, ...] = (),
) -> list[TableSpec]:
    """The publication's tables that the filters let through, described from the
    catalog the way pgoutput describes them: the columns it sends (no dropped or
    generated ones) and which are key — the primary key, the replica identity index, or
    under ``REPLICA IDENTITY FULL`` the primary key if there is one, else every column
    (a table without a key is keyed by its whole row, as its changes are). ``also``:
    further publications whose tables are included (the initial snapshot passes the
    insert-only one: its tables have no key column, their rows are ``append_only``)."""
    out = []
    rows = conn.execute(
        "SELECT DISTINCT t.schemaname, t.tablename, c.oid, c.relreplident"
        " FROM pg_catalog.pg_publication_tables t"
        " JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname"
        " JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename"
        " WHERE t.pubname = ANY(%s) ORDER BY 1, 2",
        [[publication, *also]],
    ).fetchall()
    for schema, table, oid, ident in rows:
        if not table_filter.matches(schema, table):
            continue
        if only is not None and (schema, table) not in only:
            continue
        cols = conn.execute(
            "SELECT a.attname, a.atttypid, a.atttypmod,"
            " EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = a.attrelid"
            "   AND i.indisprimary AND a.attnum = ANY(i.indkey)),"
            " EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = a.attrelid"
            "   AND i.indisreplident AND a.attnum = ANY(i.indkey))"
            " FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0"
            " AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            [oid],
        ).fetchall()
        has_pk = any(c[3] for c in cols)
        columns = []
        for name, typ, typmod, in_pk, in_ri in cols:
            if ident == "i":
                is_key = bool(in_ri)
            elif ident == "f":
                is_key = bool(in_pk) or not has_pk
            elif ident == "d":
                is_key = bool(in_pk)
            else:
                is_key = False
            columns.append(pg.Column(str(name), int(typ), int(typmod), is_key))
        leaves = conn.execute(
            "SELECT p.relid::oid, pg_catalog.pg_relation_size(p.relid)"
            " / current_setting('block_size')::int, c.reltuples, c.relpages"
            " FROM (SELECT relid FROM pg_catalog.pg_partition_tree(%s) WHERE isleaf"
            "       UNION SELECT %s::regclass) p"
            " JOIN pg_catalog.pg_class c ON c.oid = p.relid"
            " WHERE c.relkind = 'r' ORDER BY 1",
            [oid, oid],
        ).fetchall()
        estimate = 0
        known = True
        for _, pages, tuples, relpages in leaves:
            if tuples is None or tuples < 0:
                known = known and pages == 0
            elif relpages > 0:
                estimate += int(tuples / relpages * pages)
        relation = pg.Relation(int(oid), str(schema), str(table), str(ident), tuple(columns))
        out.append(
            TableSpec(
                relation,
                tuple((int(r[0]), int(r[1])) for r in leaves),
                estimate if known else None,
            )
        )
    return out


Bounds = tuple[int | None, int | None, int | None, list[str] | None, list[str] | None]
"""A chunk's range: (relation, first page, end page, lower key, upper key)."""


def plan_chunks(spec: TableSpec, chunk_pages: int) -> list[Bounds]:
    """Page ranges per chunk; each relation's last chunk is open (it takes whatever the
    relation has grown to)."""
    chunks: list[Bounds] = []
    for oid, pages in spec.leaves:
        first = 0
        while first + chunk_pages < pages:
            chunks.append((oid, first, first + chunk_pages, None, None))
            first += chunk_pages
        chunks.append((oid, first, None, None, None))
    return chunks


class SnapshotStore:
    """``_walcast.snapshots`` / ``snapshot_tables`` / ``snapshot_chunks`` (V010) on its own
    autocommit connection: one per thread."""

    def __init__(self, conninfo: str, epoch: int = 0) -> None:
        self.conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(conninfo, autocommit=True)
        self.epoch = epoch  # given to the jobs it hands out

    def close(self) -> None:
        self.conn.close()

    def create(
        self,
        slot: str,
        kind: str,
        version: int,
        tables: list[TableSpec],
        planner: Callable[[TableSpec], list[Bounds]],
        requested_by: str,
        system: Identity | None,
    ) -> Job:
        lsn = format_lsn(version)
        with self.conn.transaction():
            row = self.conn.execute(
                "INSERT INTO _walcast.snapshots (slot, kind, version, system_identifier,"
                " timeline, requested_by) VALUES (%s, %s, %s, %s, %s, %s)"
                " RETURNING id, (extract(epoch FROM created_at) * 1000000)::bigint",
                [
                    slot,
                    kind,
                    lsn,
                    system[0] if system else None,
                    system[1] if system else None,
                    requested_by,
                ],
            ).fetchone()
            assert row is not None
            job_id, started_us = int(row[0]), int(row[1])
            for ord_, spec in enumerate(tables):
                chunks = planner(spec)
                self.conn.execute(
                    "INSERT INTO _walcast.snapshot_tables (snapshot_id, schema_name,"
                    " table_name, ord, rows_estimate, chunks_total, start_lsn)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [job_id, spec.schema, spec.name, ord_, spec.rows_estimate, len(chunks), lsn],
                )
                with self.conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO _walcast.snapshot_chunks (snapshot_id, schema_name,"
                        " table_name, chunk, relation, first_page, end_page, lower_key,"
                        " upper_key) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        [
                            [
                                job_id,
                                spec.schema,
                                spec.name,
                                n,
                                rel,
                                first,
                                end,
                                None if lo is None else Jsonb(lo),
                                None if hi is None else Jsonb(hi),
                            ]
                            for n, (rel, first, end, lo, hi) in enumerate(chunks)
                        ],
                    )
        return Job(job_id, slot, kind, version, "running", self.epoch, started_us)

    def unfinished(self, slot: str, kind: str) -> Job | None:
        row = self.conn.execute(
            "SELECT id, version - '0/0'::pg_lsn, state,"
            " (extract(epoch FROM created_at) * 1000000)::bigint FROM _walcast.snapshots"
            " WHERE slot = %s AND kind = %s AND state = 'running' ORDER BY id DESC LIMIT 1",
            [slot, kind],
        ).fetchone()
        if row is None:
            return None
        return Job(int(row[0]), slot, kind, int(row[1]), str(row[2]), self.epoch, int(row[3]))

    def state(self, job: Job) -> str:
        row = self.conn.execute(
            "SELECT state FROM _walcast.snapshots WHERE id = %s", [job.id]
        ).fetchone()
        return "failed" if row is None else str(row[0])

    def finish(self, job: Job, state: str, error: str | None = None) -> None:
        self.conn.execute(
            "UPDATE _walcast.snapshots SET state = %s, finished_at = now(), error = %s"
            " WHERE id = %s AND state = 'running'",
            [state, error, job.id],
        )

    def requeue_running(self, job: Job) -> int:
        """Chunks claimed by readers of a run that died: to be read again."""
        cur = self.conn.execute(
            "UPDATE _walcast.snapshot_chunks SET state = 'pending'"
            " WHERE snapshot_id = %s AND state = 'running'",
            [job.id],
        )
        return cur.rowcount

    def claim(self, job: Job) -> Chunk | None:
        """The next pending chunk, in table order (so tables finish one after another,
        each read by every reader), taken by this reader alone."""
        with self.conn.transaction():
            row = self.conn.execute(
                "UPDATE _walcast.snapshot_chunks c SET state = 'running'"
                " FROM (SELECT x.snapshot_id, x.schema_name, x.table_name, x.chunk"
                "       FROM _walcast.snapshot_chunks x"
                "       JOIN _walcast.snapshot_tables t USING (snapshot_id, schema_name,"
                "            table_name)"
                "       WHERE x.snapshot_id = %s AND x.state = 'pending'"
                "       ORDER BY t.ord, x.chunk LIMIT 1 FOR UPDATE OF x SKIP LOCKED) n"
                " WHERE (c.snapshot_id, c.schema_name, c.table_name, c.chunk)"
                "     = (n.snapshot_id, n.schema_name, n.table_name, n.chunk)"
                " RETURNING c.schema_name, c.table_name, c.chunk, c.relation, c.first_page,"
                "     c.end_page, c.lower_key, c.upper_key, c.only_keys",
                [job.id],
            ).fetchone()
            if row is None:
                return None
            self.conn.execute(
                "UPDATE _walcast.snapshot_tables SET state = 'running', started_at = now()"
                " WHERE snapshot_id = %s AND schema_name = %s AND table_name = %s"
                " AND state = 'pending'",
                [job.id, row[0], row[1]],
            )
        return Chunk(job.id, str(row[0]), str(row[1]), int(row[2]),
                     None if row[3] is None else int(row[3]),
                     None if row[4] is None else int(row[4]),
                     None if row[5] is None else int(row[5]), row[6], row[7],
                     row[8])  # fmt: skip

    def chunk_done(self, chunk: Chunk, rows: int, version: int) -> bool:
        """Record a chunk whose every event Kafka acknowledged; True when it was its
        table's last."""
        row = self.conn.execute(
            "WITH c AS (UPDATE _walcast.snapshot_chunks SET state = 'done', rows = %s,"
            "   version = %s, done_at = now() WHERE snapshot_id = %s AND schema_name = %s"
            "   AND table_name = %s AND chunk = %s AND state <> 'done' RETURNING 1)"
            " UPDATE _walcast.snapshot_tables SET rows_done = rows_done + %s,"
            "   chunks_done = chunks_done + 1"
            " WHERE snapshot_id = %s AND schema_name = %s AND table_name = %s"
            "   AND EXISTS (SELECT 1 FROM c) RETURNING chunks_done >= chunks_total",
            [
                rows,
                format_lsn(version),
                chunk.snapshot_id,
                chunk.schema,
                chunk.table,
                chunk.chunk,
                rows,
                chunk.snapshot_id,
                chunk.schema,
                chunk.table,
            ],
        ).fetchone()
        return bool(row and row[0])

    def read_again(self, chunk: Chunk, keys: list[str]) -> int | None:
        """A new pending chunk of ``chunk``'s key range holding only ``keys`` (the events'
        keys, JSON text), counted in its table's chunks; its number (None: ``chunk`` is
        gone, its run cancelled). Called before ``chunk`` is recorded done, so the table
        cannot be closed in between, and a crash before that reads both again (a read is
        idempotent)."""
        with self.conn.transaction():
            row = self.conn.execute(
                "INSERT INTO _walcast.snapshot_chunks (snapshot_id, schema_name, table_name,"
                "   chunk, lower_key, upper_key, only_keys)"
                " SELECT c.snapshot_id, c.schema_name, c.table_name, (SELECT max(x.chunk) + 1"
                "   FROM _walcast.snapshot_chunks x WHERE (x.snapshot_id, x.schema_name,"
                "   x.table_name) = (c.snapshot_id, c.schema_name, c.table_name)),"
                "   c.lower_key, c.upper_key, %s"
                " FROM _walcast.snapshot_chunks c WHERE c.snapshot_id = %s"
                "   AND c.schema_name = %s AND c.table_name = %s AND c.chunk = %s"
                " RETURNING chunk",
                [Jsonb(keys), chunk.snapshot_id, chunk.schema, chunk.table, chunk.chunk],
            ).fetchone()
            if row is None:
                return None
            self.conn.execute(
                "UPDATE _walcast.snapshot_tables SET chunks_total = chunks_total + 1"
                " WHERE snapshot_id = %s AND schema_name = %s AND table_name = %s",
                [chunk.snapshot_id, chunk.schema, chunk.table],
            )
        return int(row[0])

    def tables_to_close(self, job: Job) -> list[tuple[str, str, int, int]]:
        """Tables whose chunks are all done but whose end marker is not recorded sent:
        (schema, table, start version, rows)."""
        rows = self.conn.execute(
            "SELECT schema_name, table_name, start_lsn - '0/0'::pg_lsn, rows_done"
            " FROM _walcast.snapshot_tables WHERE snapshot_id = %s"
            " AND chunks_done >= chunks_total AND state <> 'done' ORDER BY ord",
            [job.id],
        ).fetchall()
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]

    def table_done(self, job: Job, schema: str, table: str) -> None:
        self.conn.execute(
            "UPDATE _walcast.snapshot_tables SET state = 'done', finished_at = now()"
            " WHERE snapshot_id = %s AND schema_name = %s AND table_name = %s",
            [job.id, schema, table],
        )

    def requeue(self, chunk: Chunk) -> None:
        """A chunk to be read again (its rows were not sent, or not acknowledged)."""
        self.conn.execute(
            "UPDATE _walcast.snapshot_chunks SET state = 'pending' WHERE snapshot_id = %s"
            " AND schema_name = %s AND table_name = %s AND chunk = %s AND state = 'running'",
            [chunk.snapshot_id, chunk.schema, chunk.table, chunk.chunk],
        )

    def running_incremental(self, slot: str) -> list[Job]:
        rows = self.conn.execute(
            "SELECT id, version - '0/0'::pg_lsn FROM _walcast.snapshots WHERE slot = %s"
            " AND kind = 'incremental' AND state = 'running' ORDER BY id",
            [slot],
        ).fetchall()
        return [Job(int(r[0]), slot, "incremental", int(r[1]), "running", self.epoch) for r in rows]

    def table_counts(self, job_id: int, schema: str, table: str) -> tuple[int, int]:
        """(chunks not recorded done, rows recorded) of one table of a run."""
        row = self.conn.execute(
            "SELECT chunks_total - chunks_done, rows_done FROM _walcast.snapshot_tables"
            " WHERE snapshot_id = %s AND schema_name = %s AND table_name = %s",
            [job_id, schema, table],
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def start_version(self, job_id: int, schema: str, table: str) -> int:
        row = self.conn.execute(
            "SELECT start_lsn - '0/0'::pg_lsn FROM _walcast.snapshot_tables"
            " WHERE snapshot_id = %s AND schema_name = %s AND table_name = %s",
            [job_id, schema, table],
        ).fetchone()
        return int(row[0]) if row else 0

    def floors(self, slot: str) -> dict[tuple[str, str], int]:
        """Truncate / creation positions of the stream's tables: every one recorded since
        V014 (``_walcast.table_floors``), and those recorded for running runs before."""
        rows = self.conn.execute(
            "SELECT schema_name, table_name, max(lsn) - '0/0'::pg_lsn FROM ("
            " SELECT t.schema_name, t.table_name, t.floor_lsn AS lsn"
            " FROM _walcast.snapshot_tables t JOIN _walcast.snapshots s ON s.id = t.snapshot_id"
            " WHERE s.slot = %s AND s.state = 'running' AND t.floor_lsn IS NOT NULL"
            " UNION ALL SELECT schema_name, table_name, floor_lsn FROM _walcast.table_floors"
            " WHERE slot = %s) f GROUP BY 1, 2",
            [slot, slot],
        ).fetchall()
        return {(str(r[0]), str(r[1])): int(r[2]) for r in rows}

    def record_floor(self, slot: str, schema: str, table: str, lsn: int) -> None:
        """The table was truncated or created at ``lsn`` (called before that position can
        be confirmed to the slot: a restart then still knows it)."""
        floor = format_lsn(lsn)
        self.conn.execute(
            "INSERT INTO _walcast.table_floors AS f (slot, schema_name, table_name, floor_lsn)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (slot, schema_name, table_name) DO UPDATE"
            " SET floor_lsn = GREATEST(f.floor_lsn, EXCLUDED.floor_lsn), recorded_at = now()",
            [slot, schema, table, floor],
        )
        self.conn.execute(
            "UPDATE _walcast.snapshot_tables t SET floor_lsn = %s FROM _walcast.snapshots s"
            " WHERE s.id = t.snapshot_id AND s.state = 'running' AND s.slot = %s"
            " AND t.schema_name = %s AND t.table_name = %s",
            [floor, slot, schema, table],
        )

    def finish_if_complete(self, job_id: int) -> bool:
        row = self.conn.execute(
            "UPDATE _walcast.snapshots SET state = 'done', finished_at = now() WHERE id = %s"
            " AND state = 'running' AND NOT EXISTS (SELECT 1 FROM _walcast.snapshot_tables"
            " WHERE snapshot_id = %s AND state <> 'done') RETURNING id",
            [job_id, job_id],
        ).fetchone()
        return row is not None

    def progress(self, job: Job) -> list[dict[str, Any]]:
        return snapshot_progress(self.conn, job.id)

    def restart_lsn(self, slot: str) -> int:
        row = self.conn.execute(
            "SELECT restart_lsn - '0/0'::pg_lsn FROM pg_catalog.pg_replication_slots"
            " WHERE slot_name = %s",
            [slot],
        ).fetchone()
        if row is None:
            raise RetriableError(f"replication slot {slot!r} is gone")
        if row[0] is None:
            raise PermanentError(
                f"replication slot {slot!r} has no restart_lsn (it was invalidated)",
                hint="recreate the slot: pg2kafka tear-down, then run (a new initial snapshot)",
            )
        return int(row[0])

    def slot_exists(self, slot: str) -> bool:
        row = self.conn.execute(
            "SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = %s", [slot]
        ).fetchone()
        return row is not None


def snapshot_progress(conn: psycopg.Connection[Any], job_id: int) -> list[dict[str, Any]]:
    """Per table of a run: state, rows done, estimate, chunks done / total, timings."""
    rows = conn.execute(
        "SELECT schema_name, table_name, state, rows_done, rows_estimate, chunks_done,"
        " chunks_total, extract(epoch FROM coalesce(finished_at, now()) - started_at)"
        " FROM _walcast.snapshot_tables WHERE snapshot_id = %s ORDER BY ord",
        [job_id],
    ).fetchall()
    return [
        {
            "table": f"{r[0]}.{r[1]}",
            "state": r[2],
            "rows": int(r[3]),
            "estimate": None if r[4] is None else int(r[4]),
            "chunks_done": int(r[5]),
            "chunks": int(r[6]),
            "seconds": None if r[7] is None else float(r[7]),
        }
        for r in rows
    ]


class SnapshotProducer:
    """One reader's way into Kafka: a bulk producer (acknowledged chunk by chunk, by
    :meth:`flush`) within its share of the memory guard, and the stream's routing."""

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        inflight_bytes: int,
        epoch: int = 0,
        while_waiting: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.epoch = epoch
        self.sink = BulkKafkaSink(
            producer_config(settings),
            max_inflight_bytes=inflight_bytes,
            while_waiting=while_waiting,
        )
        self.topics = Topics(settings, self.sink)
        self.routing = Routing(settings, StreamTarget.cdc(settings), self.topics.ensure)
        # producer.encoding=avro: the same per-table schemas as the stream's.
        self.avro = event_encoder(settings)

    def encode(
        self, topic: str, ev: ChangeEvent | dict[str, Any], shape: Shape | None = None
    ) -> bytes:
        """An event's record value in the producer's encoding (``shape``: see
        :meth:`shared.avro.RegistryEncoder.encode`)."""
        return orjson.dumps(ev) if self.avro is None else self.avro.encode(topic, ev, shape)

    def marker(
        self, db: str, schema: str, table: str, version: int, info: SnapshotInfo,
        shape: Shape | None = None,
    ) -> None:  # fmt: skip
        """A table's start or end marker: under ``primary_key`` keys to every partition
        (the table's rows are spread over all of them), else by the table's key. The
        Debezium format has no such markers: nothing is written."""
        if self.settings.producer.format == "debezium":
            return
        ev: ChangeEvent = {"v": EVENT_VERSION, "op": "snapshot", "db": db, "schema": schema,
                           "table": table, "lsn": version, "seq": 0, "commit_lsn": version,
                           "xid": 0, "commit_ts": iso_utc(time.time_ns() // 1000),
                           "key": {}, "new": None, "old": None, "snapshot": info}  # fmt: skip
        if self.epoch:
            ev["epoch"] = self.epoch
        topic = self.routing.topic(db, schema, table)
        value = self.encode(topic, ev, shape)
        if self.routing.mode == "primary_key":
            for partition in range(self.topics.refresh(topic)):
                self.sink.write(topic, value, table_key(schema, table), partition)
        else:
            self.sink.write(topic, value, self.routing.key(ev))

    def flush(self) -> None:
        self.sink.flush(self.settings.producer.delivery_timeout_ms / 1000 + 30)

    def close(self) -> None:
        self.sink.close()


class Flag(Protocol):
    """A threading or multiprocessing event."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass
class RunControl:
    """What the readers of one process share: a halt flag (stop, cancel or a reader's
    failure), the first failure, the rate bound and the rows read. ``parent``: in a
    reader process, the pid of the pg2kafka that started it: a reader whose pg2kafka
    died (kill -9) stops at its next look instead of reading on as an orphan."""

    stop: Flag
    max_rows_per_s: float | None
    halt: Flag = field(default_factory=threading.Event)
    parent: int | None = None
    errors: list[BaseException] = field(default_factory=list)
    rows: int = 0
    started: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def halted(self) -> bool:
        if self.parent is not None and os.getppid() != self.parent:
            self.halt.set()
        return self.halt.is_set() or self.stop.is_set()

    def count(self, rows: int) -> None:
        """Add ``rows``; waits as long as the run is ahead of ``max_rows_per_s``."""
        with self.lock:
            self.rows += rows
            total = self.rows
        if self.max_rows_per_s:
            ahead = total / self.max_rows_per_s - (time.monotonic() - self.started)
            if ahead > 0:
                self.halt.wait(min(ahead, 1.0))


class Reader:
    """One reader thread: claims chunks, reads each in one short transaction (under the
    exported snapshot while it exists), sends its events, records it once acked."""

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        job: Job,
        tables: dict[tuple[str, str], TableSpec],
        control: RunControl,
        snapshot_name: str | None,
        producer: SnapshotProducer,
    ) -> None:
        self.settings = settings
        self.job = job
        self.tables = tables
        self.control = control
        self.snapshot_name = snapshot_name
        self.producer = producer
        conninfo = settings.postgres.conninfo()
        self.conninfo = conninfo
        self.catalog = Catalog(conninfo)
        self.builder = EventBuilder(
            settings.postgres.database,
            TypeRegistry(self.catalog.type_info),
            scrub_secrets=settings.ddl.scrub_secrets,
            primary_key=self.catalog.primary_key,
            transforms=from_settings(settings.transforms),
        )
        self.names: dict[int, sql.Composable] = {}
        # producer.format=debezium: rows become the connector's `r` records.
        self.debezium = (
            DebeziumRecords(
                settings.debezium,
                settings.postgres.database,
                self.builder.types,
                self.catalog.not_null,
                self.catalog.primary_key,
                avro=connect_encoder(settings),
                transforms=self.builder.transforms,
            )
            if settings.producer.format == "debezium"
            else None
        )

    def run(self) -> None:
        store = SnapshotStore(self.conninfo)
        try:
            with psycopg.connect(
                self.conninfo,
                autocommit=True,
                options=SESSION_OPTIONS
                + (" " + DEBEZIUM_SESSION_OPTIONS if self.debezium is not None else ""),
                application_name=f"pg2kafka-snapshot:{self.job.slot}",
            ) as conn:
                while not self.control.halted():
                    chunk = store.claim(self.job)
                    if chunk is None:
                        break
                    version = store.restart_lsn(self.job.slot) - 1
                    rows = self.read(conn, chunk, version)
                    if rows is None:
                        break  # halted mid-chunk: it stays claimed, and is read again
                    self.producer.flush()  # checkpoint last: acknowledged, then recorded
                    failpoint("snapshot.chunk_sent")
                    if store.chunk_done(chunk, rows, version):
                        close_tables(self.settings, store, self.job, self.producer)
                    failpoint("snapshot.chunk_done")
        except BaseException as exc:  # noqa: BLE001 - raised by run_job on its thread
            self.control.errors.append(exc)
            self.control.halt.set()
        finally:
            store.close()
            self.catalog.close()

    def read(self, conn: psycopg.Connection[Any], chunk: Chunk, version: int) -> int | None:
        """Send the chunk's rows to Kafka (not yet acknowledged); their count, or None
        when halted before the end."""
        spec = self.tables[(chunk.schema, chunk.table)]
        rel = spec.relation
        dbz = self.debezium
        encode = self.producer.encode
        # Postgres writes the JSON itself on the fast path: never for a table a transform
        # rule touches (its values must pass through the rules).
        transforms = self.builder.transforms
        fast = (dbz is None and self.producer.avro is None
                and (transforms is None or not transforms.touches(rel.schema, rel.table))
                and pg_json_table(rel, self.builder.types))  # fmt: skip
        assert chunk.relation is not None  # the initial snapshot reads page ranges
        # An insert-only table's rows are identified by their place in the chunk (``seq``):
        # read in ctid order, a chunk read again numbers them the same way.
        query = chunk_query(self._name(conn, chunk.relation), rel, chunk_where(conn, rel, chunk),
                            fast, by_ctid=append_only(rel))  # fmt: skip
        read_at = iso_utc(time.time_ns() // 1000)
        info: SnapshotInfo = {"id": chunk.snapshot_id, "chunk": chunk.chunk}
        sink = self.producer.sink
        produce = sink.producer.produce
        routing = self.producer.routing
        topic = (
            routing.topic(self.settings.postgres.database, rel.schema, rel.table)
            if dbz is None
            else dbz.table(rel).topic
        )
        limit = self.producer.topics.value_limit(topic)
        snap: SnapshotRead | None = None
        key: bytes | None
        per_row_key = routing.mode == "primary_key" and any(c.is_key for c in rel.columns)
        keyless = not any(c.is_key for c in rel.columns)
        fixed_key = (
            rel.schema.encode() if routing.mode == "schema" else table_key(rel.schema, rel.table)
        )
        epoch = self.job.epoch
        head, middle, tail = pg_json_frame(
            self.settings.postgres.database, rel, version, read_at, info, self.builder, epoch,
            append_only=append_only(rel),
        )  # fmt: skip
        join = b"".join
        new_field = b',"new":'
        rows = 0
        halted = False
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if self.snapshot_name is not None:
                    conn.execute(
                        sql.SQL("SET TRANSACTION SNAPSHOT {}").format(
                            sql.Literal(self.snapshot_name)
                        )
                    )
                if dbz is not None:
                    snap = snapshot_read(conn, self.job, version)
                with conn.cursor().copy(query) as copy:
                    copy.set_types(["text"] * (2 if fast else len(rel.columns)))
                    for values in copy.rows():
                        # The hot loop: a read row costs its bytes and one produce call.
                        if fast:
                            key_json, new_json = values
                            if key_json is None:
                                key_json = "{}" if keyless else new_json
                            value = join((head, str(rows).encode(), middle, key_json.encode(),
                                          new_field, new_json.encode(), tail))  # fmt: skip
                            key = (
                                row_key(rel.schema, rel.table, orjson.loads(key_json))
                                if per_row_key
                                else fixed_key
                            )
                            if len(value) + len(key) > limit:
                                value = oversized(orjson.loads(value), len(value))
                        elif dbz is not None:
                            assert snap is not None
                            record = dbz.read(rel, values, snap)
                            assert record.value is not None
                            value, key = record.value, record.key
                            if len(value) + len(key or b"") > limit:
                                raise too_large(
                                    f"a row of {rel.schema}.{rel.table}", topic,
                                    len(value) + len(key or b""), limit,
                                )  # fmt: skip
                        else:
                            ev = self.builder.read(rel, values, version, rows, read_at, info)
                            set_epoch(ev, epoch)
                            value = encode(topic, ev)
                            key = routing.key(ev)
                            if len(value) + len(key) > limit:
                                value = encode(topic, oversized_event(ev, len(value)))
                        try:
                            produce(topic, value, key)
                        except BufferError:
                            sink.write(topic, value, key)
                        rows += 1
                        if rows % POLL_EVERY == 0:
                            sink.poll()
                            self.control.count(POLL_EVERY)
                            if self.control.halted():
                                halted = True
                                conn.cancel_safe()
                                break
        except psycopg.errors.QueryCanceled:
            if not halted:
                raise
        if halted:
            return None
        self.control.count(rows % POLL_EVERY)
        return rows

    def _name(self, conn: psycopg.Connection[Any], oid: int) -> sql.Composable:
        name = self.names.get(oid)
        if name is None:
            row = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
                [oid],
            ).fetchone()
            if row is None:
                raise RetriableError(f"relation {oid} of the snapshot is gone")
            name = self.names[oid] = sql.Identifier(str(row[0]), str(row[1]))
        return name


def snapshot_read(conn: psycopg.Connection[Any], job: Job, version: int) -> SnapshotRead:
    """The Debezium ``source`` of a chunk's rows, read in its transaction: ``lsn`` the
    slot's restart position (``version`` + 1) — not its consistent point, as the
    connector writes: a transaction that began before that point and committed after it
    is streamed with changes below it, and a sink ordering by LSN would keep the read row
    over them (docs/snapshots-design.md); below every streamed change, the row loses to
    each. Also the run's start and the first transaction the snapshot does not see."""
    row = conn.execute(
        "SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint"
    ).fetchone()
    assert row is not None
    return SnapshotRead(lsn=version + 1, started_us=job.started_us, xid=int(row[0]))


def oversized_event(ev: dict[str, Any] | ChangeEvent, size: int) -> dict[str, Any]:
    """A row too large for its topic travels as a reference without its row (as a
    change does); consumers dead-letter it with the reason."""
    ref = {k: v for k, v in ev.items() if k not in ("new", "old")}
    ref["new"] = None
    ref["old"] = None
    ref["oversized"] = size
    return ref


def oversized(ev: dict[str, Any] | ChangeEvent, size: int) -> bytes:
    """:func:`oversized_event`, as JSON."""
    return orjson.dumps(oversized_event(ev, size))


def pg_json_table(rel: pg.Relation, types: TypeRegistry) -> bool:
    """Whether Postgres can write the table's rows as JSON (see :data:`PG_JSON_TYPES`)."""
    return all(c.type_oid in PG_JSON_TYPES for c in rel.columns)


def pg_json_frame(
    db: str,
    rel: pg.Relation,
    version: int,
    read_at: str,
    info: SnapshotInfo,
    builder: EventBuilder,
    epoch: int = 0,
    *,
    append_only: bool = False,
) -> tuple[bytes, bytes, bytes]:
    """The bytes around a read row's seq, key and row, in the contract's field order
    (``append_only``: a row of an insert-only table, flagged as the builder flags it)."""
    dumps = orjson.dumps
    types = {c.name: builder.types.name(c.type_oid) for c in rel.columns}
    head = b'{"v":%d,"op":"read","db":%b,"schema":%b,"table":%b,"lsn":%d,"seq":' % (
        EVENT_VERSION, dumps(db), dumps(rel.schema), dumps(rel.table), version)  # fmt: skip
    middle = b',"commit_lsn":%d,"xid":0,"commit_ts":%b,"key":' % (version, dumps(read_at))
    tail = b',"old":null,"types":%b,"snapshot":%b' % (dumps(types), dumps(info))
    if epoch:
        tail += b',"epoch":%d' % epoch
    tail += b',"append_only":true}' if append_only else b"}"
    return head, middle, tail


def chunk_where(conn: psycopg.Connection[Any], rel: pg.Relation, chunk: Chunk) -> sql.Composable:
    """The rows of a chunk: its pages (``ctid`` range, a TID range scan) or its keys
    (``lower_key`` <= key < ``upper_key``, each bound cast to the key column's type)."""
    if chunk.first_page is not None:
        where: sql.Composable = sql.SQL("ctid >= {}::tid").format(
            sql.Literal(f"({chunk.first_page},0)")
        )
        if chunk.end_page is not None:
            where = sql.SQL("{} AND ctid < {}::tid").format(
                where, sql.Literal(f"({chunk.end_page},0)")
            )
        return where
    keys = [c for c in rel.columns if c.is_key]
    types = [
        str(conn.execute("SELECT format_type(%s, %s)", [c.type_oid, c.type_modifier]).fetchone()[0])  # type: ignore[index]
        for c in keys
    ]
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in keys)
    lhs = names if len(keys) == 1 else sql.SQL("({})").format(names)

    def bound(values: list[str]) -> sql.Composable:
        # format_type() quotes what needs quoting: server text, not user input.
        casts = sql.SQL(", ").join(
            sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(t))
            for v, t in zip(values, types, strict=True)
        )
        return casts if len(keys) == 1 else sql.SQL("({})").format(casts)

    parts = []
    if chunk.lower_key is not None:
        parts.append(sql.SQL("{} >= {}").format(lhs, bound(chunk.lower_key)))
    if chunk.upper_key is not None:
        parts.append(sql.SQL("{} < {}").format(lhs, bound(chunk.upper_key)))
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")


def chunk_query(
    name: sql.Composable,
    rel: pg.Relation,
    where: sql.Composable,
    pg_json: bool,
    *,
    by_ctid: bool = False,
) -> sql.Composed:
    """COPY of one chunk's rows: the columns pgoutput sends, as text; or, for a table
    Postgres can write as JSON, its key and its row as JSON. ``by_ctid``: in physical
    order (an insert-only table's chunk, whose rows are numbered by their place)."""
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in rel.columns)
    inner = sql.SQL("SELECT {} FROM ONLY {} WHERE {}{}").format(
        cols, name, where, sql.SQL(" ORDER BY ctid") if by_ctid else sql.SQL("")
    )
    if not pg_json:
        return sql.SQL("COPY ({}) TO STDOUT").format(inner)
    keys = [c for c in rel.columns if c.is_key]
    key: sql.Composable
    if keys and len(keys) < len(rel.columns):
        key = sql.SQL("json_build_object({})::text").format(
            sql.SQL(", ").join(
                sql.SQL("{}, s.{}").format(sql.Literal(c.name), sql.Identifier(c.name))
                for c in keys
            )
        )
    else:
        key = sql.SQL("NULL::text")  # every column is the key (or none is): the row
    return sql.SQL("COPY (SELECT {}, to_json(s)::text FROM ({}) s) TO STDOUT").format(key, inner)


def close_tables(
    settings: Pg2KafkaSettings, store: SnapshotStore, job: Job, producer: SnapshotProducer
) -> None:
    """Send the end marker of every table whose chunks are all done, wait for Kafka, then
    record the table done (a crash in between sends the marker again: it is idempotent)."""
    db = settings.postgres.database
    for schema, table, start, rows in store.tables_to_close(job):
        producer.marker(db, schema, table, start, {"id": job.id, "phase": "end", "rows": rows})
        producer.flush()
        store.table_done(job, schema, table)
        log.info("snapshot of %s.%s done: %d rows", schema, table, rows)


class Progress:
    """The run log, a progress bar on a terminal, and the metrics, every
    ``progress_interval_s`` (the bar every second)."""

    def __init__(self, settings: Pg2KafkaSettings, metrics: Metrics, job: Job) -> None:
        self.interval = settings.snapshot.progress_interval_s
        self.metrics = metrics
        self.job = job
        self.started = time.monotonic()
        self.first_rows: int | None = None
        self.last_log = 0.0
        self.tty = sys.stderr.isatty() and job.kind == "initial"  # a bar only before streaming

    def report(self, tables: list[dict[str, Any]], final: bool = False) -> None:
        now = time.monotonic()
        done = sum(t["rows"] for t in tables)
        if self.first_rows is None:
            self.first_rows = done  # rows of an earlier run: not this run's speed
        estimate = sum(max(t["estimate"] or 0, t["rows"]) for t in tables)
        elapsed = max(now - self.started, 1e-6)
        rate = (done - self.first_rows) / elapsed
        eta = (estimate - done) / rate if rate > 0 and estimate > done else None
        chunks_left = sum(t["chunks"] - t["chunks_done"] for t in tables)
        for t in tables:
            self.metrics.snapshot_rows.labels(t["table"]).set(t["rows"])
            self.metrics.snapshot_rows_estimate.labels(t["table"]).set(t["estimate"] or 0)
            self.metrics.snapshot_chunks_left.labels(t["table"]).set(t["chunks"] - t["chunks_done"])
        self.metrics.snapshot_rate.set(rate)
        if self.tty:
            share = done / estimate if estimate else 1.0
            bar = "#" * int(30 * min(share, 1.0))
            sys.stderr.write(
                f"\rsnapshot [{bar:<30}] {share:6.1%} {done:,}/{estimate:,} rows"
                f" {rate:,.0f}/s ETA {format_eta(eta)} "
            )
            if final:
                sys.stderr.write("\n")
            sys.stderr.flush()
        if final or now - self.last_log >= self.interval:
            self.last_log = now
            for t in tables:
                if t["state"] != "running" and not final:
                    continue
                log.info(
                    "snapshot %s: %s", t["table"], t["state"],
                    extra={"snapshot": self.job.id, "table": t["table"], "rows": t["rows"],
                           "estimate": t["estimate"],
                           "chunks_left": t["chunks"] - t["chunks_done"]},
                )  # fmt: skip
            log.info(
                "snapshot %d: %d of ~%d rows, %.0f rows/s, ETA %s, %d chunks left",
                self.job.id, done, estimate, rate, format_eta(eta), chunks_left,
                extra={"snapshot": self.job.id, "rows": done, "estimate": estimate,
                       "rows_per_s": round(rate), "eta_s": None if eta is None else round(eta),
                       "chunks_left": chunks_left},
            )  # fmt: skip


def format_eta(eta: float | None) -> str:
    if eta is None:
        return "-"
    minutes, seconds = divmod(int(eta), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def reader_process(
    settings: Pg2KafkaSettings,
    job: Job,
    tables: list[TableSpec],
    snapshot_name: str | None,
    budget: int,
    rate: float | None,
    halt: Flag,
    failures: Any,
    parent: int,
) -> None:
    """A reader process (``snapshot.workers`` > 1): Python runs one thread at a time, so
    readers that should add up run in processes of their own. A failure is put on
    ``failures`` as (permanent, message, hint) for pg2kafka to raise."""
    configure_logging(settings.log.level, settings.log.format)
    control = RunControl(halt, rate, halt=halt, parent=parent)
    producer = SnapshotProducer(settings, budget, job.epoch)
    by_name = {(t.schema, t.name): t for t in tables}
    try:
        Reader(settings, job, by_name, control, snapshot_name, producer).run()
    finally:
        producer.close()
    if control.errors:
        exc = control.errors[0]
        permanent = not is_retriable(exc)
        failures.put((permanent, f"snapshot reader: {exc}", operator_hint(exc)))
        halt.set()
        sys.exit(1)


class Readers:
    """``snapshot.workers`` readers: the first on a thread of pg2kafka's own process, the
    others each in a process of their own (``spawn``: nothing of this process's threads
    or connections is inherited) — Python runs one thread at a time, so readers that
    should add up cannot all be threads, and one process fewer is one interpreter's
    memory fewer. Each has its share of the memory guard and of the rate bound."""

    def __init__(
        self,
        settings: Pg2KafkaSettings,
        job: Job,
        tables: list[TableSpec],
        snapshot_name: str | None,
        stop: threading.Event,
    ) -> None:
        workers = settings.snapshot.workers
        ctx = multiprocessing.get_context("spawn")
        self.halted = ctx.Event()
        self.failures = ctx.Queue()
        rate = settings.snapshot.max_rows_per_s
        share = None if rate is None else rate / workers
        budget = max(settings.producer.max_inflight_bytes // workers, 1024 * 1024)
        self.control = RunControl(stop, share, halt=self.halted)
        self.producer = SnapshotProducer(settings, budget, job.epoch)
        by_name = {(t.schema, t.name): t for t in tables}
        reader = Reader(settings, job, by_name, self.control, snapshot_name, self.producer)
        self.thread = threading.Thread(target=reader.run, name="snapshot-0", daemon=True)
        self.procs = [
            ctx.Process(
                target=reader_process,
                args=(
                    settings,
                    job,
                    tables,
                    snapshot_name,
                    budget,
                    share,
                    self.halted,
                    self.failures,
                    os.getpid(),
                ),
                name=f"pg2kafka-snapshot-{n}",
                daemon=True,
            )
            for n in range(1, workers)
        ]

    def start(self) -> None:
        for p in self.procs:
            p.start()
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive() or any(p.is_alive() for p in self.procs)

    def join(self, timeout: float) -> None:
        self.thread.join(timeout / (len(self.procs) + 1))
        for p in self.procs:
            p.join(timeout / (len(self.procs) + 1))

    def halt(self) -> None:
        self.halted.set()

    def raise_failure(self) -> None:
        if self.control.errors:
            raise self.control.errors[0]
        try:
            permanent, message, hint = self.failures.get_nowait()
        except queue.Empty:
            dead = [p.exitcode for p in self.procs if p.exitcode not in (0, None)]
            if dead:
                raise RetriableError(f"a snapshot reader process died (exit {dead[0]})") from None
            return
        if permanent:
            raise PermanentError(message, hint=hint)
        raise RetriableError(message)

    def close(self) -> None:
        self.halt()
        self.thread.join(60)
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        self.producer.close()


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
    store = SnapshotStore(settings.postgres.conninfo())
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
    store = SnapshotStore(conninfo, epoch)
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
    """Each table's start marker, with the source the rows are read from."""
    producer = SnapshotProducer(settings, settings.producer.max_inflight_bytes, job.epoch)
    catalog = Catalog(settings.postgres.conninfo()) if producer.avro is not None else None
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
            producer.marker(
                settings.postgres.database, t.schema, t.name, job.version,
                {"id": job.id, "phase": "start",
                 "source": {"system": system[0], "timeline": system[1]}},
                shape,
            )  # fmt: skip
        producer.flush()
    finally:
        producer.close()
        if catalog is not None:
            catalog.close()


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
                if settings.producer.format == "debezium":
                    return (
                        "producer.format=debezium has no incremental snapshots: the sinks"
                        " keep the old source's rows this one lacks; to read every table"
                        " again, pg2kafka tear-down, then run (a new initial snapshot)"
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


__all__ = [
    "SnapshotStore",
    "TableSpec",
    "after_source_change",
    "describe_tables",
    "drop_slot",
    "initial_snapshot",
    "plan_chunks",
    "run_job",
    "snapshot_progress",
]
