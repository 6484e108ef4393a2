"""The durable state of snapshot runs (``_walcast.snapshots`` / ``snapshot_tables`` /
``snapshot_chunks``, V010): which chunks are pending, claimed, done; which tables are
closed. A chunk is recorded done only after Kafka acknowledged its rows (checkpoint
last), so a run killed at any point resumes at its first unfinished chunk."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from services.pg2kafka.replication import Identity, format_lsn
from services.pg2kafka.snapshots.chunks import Bounds, Chunk, Job, TableSpec
from shared.errors import PermanentError, RetriableError

log = logging.getLogger(__name__)


class SnapshotStore(Protocol):
    """The durable state of snapshot runs. One store per thread (readers each open their
    own); every method is one transaction, so two readers, threads or processes, never
    claim the same chunk, and a crash between two calls leaves a state the next run
    resumes from. A run is ``running`` until ``done``, ``cancelled`` or ``failed``; a
    chunk is ``pending``, ``running`` (claimed) or ``done``; a table is ``pending``,
    ``running`` (a chunk claimed) or ``done`` (its end marker sent). Implemented on
    Postgres (:class:`PostgresSnapshotStore`) and in memory
    (:class:`services.pg2kafka.snapshots.memory.InMemorySnapshotStore`, for tests);
    ``tests/snapshot_store_contract.py`` holds both to the same behaviour."""

    epoch: int  # the source's epoch, given to the jobs the store hands out

    def close(self) -> None: ...

    def create(
        self,
        slot: str,
        kind: str,
        version: int,
        tables: list[TableSpec],
        planner: Callable[[TableSpec], list[Bounds]],
        requested_by: str,
        system: Identity | None,
        key_ranges: Mapping[tuple[str, str], Any] | None = None,
    ) -> Job:
        """A new ``running`` run of ``tables`` at ``version``, each table's chunks from
        ``planner`` (numbered from 0, read in table order); ``key_ranges``: the tables
        read by key ranges only, with their ranges (shared/contract/keyranges.py), which
        their end markers carry."""
        ...

    def unfinished(self, slot: str, kind: str) -> Job | None:
        """The newest ``running`` run of that kind for ``slot``."""
        ...

    def state(self, job: Job) -> str:
        """The run's state (``failed`` when it is gone)."""
        ...

    def finish(self, job: Job, state: str, error: str | None = None) -> None:
        """End a ``running`` run (a run already ended keeps its state)."""
        ...

    def requeue_running(self, job: Job) -> int:
        """Chunks claimed by readers of a run that died, pending again: how many."""
        ...

    def claim(self, job: Job) -> Chunk | None:
        """The next pending chunk in table order, then chunk order, taken by this reader
        alone (``running``); its table becomes ``running``. None: nothing pending."""
        ...

    def chunk_done(self, chunk: Chunk, rows: int, version: int) -> bool:
        """Record a chunk whose every event Kafka acknowledged (its rows counted once,
        also when recorded twice); True when it was its table's last."""
        ...

    def read_again(self, chunk: Chunk, keys: list[str]) -> int | None:
        """A new pending chunk of ``chunk``'s key range holding only ``keys``, counted in
        its table's chunks; its number (None: ``chunk`` is gone)."""
        ...

    def tables_to_close(self, job: Job) -> list[tuple[str, str, int, int]]:
        """Tables whose chunks are all done and that are not ``done``, in table order:
        (schema, table, start version, rows)."""
        ...

    def table_done(self, job: Job, schema: str, table: str) -> None:
        """The table's end marker was acknowledged."""
        ...

    def requeue(self, chunk: Chunk) -> None:
        """A claimed chunk to be read again (its rows were not sent, or not acked)."""
        ...

    def running_incremental(self, slot: str) -> list[Job]:
        """The ``running`` incremental runs of ``slot``, oldest first."""
        ...

    def table_counts(self, job_id: int, schema: str, table: str) -> tuple[int, int]:
        """(chunks not recorded done, rows recorded) of one table of a run; (0, 0) for a
        table the run does not have."""
        ...

    def start_version(self, job_id: int, schema: str, table: str) -> int:
        """The version the table's run started at (0 for a table the run does not have)."""
        ...

    def table_key_ranges(self, job_id: int, schema: str, table: str) -> Any:
        """The key ranges the table's run reads (None: the whole table)."""
        ...

    def floors(self, slot: str) -> dict[tuple[str, str], int]:
        """The newest truncate or creation position recorded per table of ``slot``."""
        ...

    def record_floor(self, slot: str, schema: str, table: str, lsn: int) -> None:
        """The table was truncated or created at ``lsn`` (never moves a floor back)."""
        ...

    def finish_if_complete(self, job_id: int) -> bool:
        """Mark a ``running`` run whose tables are all ``done`` done; True if it did."""
        ...

    def progress(self, job: Job) -> list[dict[str, Any]]:
        """Per table in order: table, state, rows, estimate, chunks_done, chunks,
        seconds (since its first claim; None before)."""
        ...

    def restart_lsn(self, slot: str) -> int:
        """The slot's restart position; RetriableError when the slot is gone,
        PermanentError when it was invalidated."""
        ...

    def slot_exists(self, slot: str) -> bool: ...


def _json_or_none(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


class PostgresSnapshotStore:
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
        key_ranges: Mapping[tuple[str, str], Any] | None = None,
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
                    " table_name, ord, rows_estimate, chunks_total, start_lsn, key_ranges)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                    [
                        job_id,
                        spec.schema,
                        spec.name,
                        ord_,
                        spec.rows_estimate,
                        len(chunks),
                        lsn,
                        _json_or_none((key_ranges or {}).get((spec.schema, spec.name))),
                    ],
                )
                with self.conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO _walcast.snapshot_chunks (snapshot_id, schema_name,"
                        " table_name, chunk, relation, first_page, end_page, lower_key,"
                        " upper_key, bounds) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
                                bounds,
                            ]
                            for n, (rel, first, end, lo, hi, bounds) in enumerate(chunks)
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
                " FROM (SELECT x.snapshot_id, x.schema_name, x.table_name, x.chunk,"
                "       t.key_ranges IS NOT NULL AS ranged"
                "       FROM _walcast.snapshot_chunks x"
                "       JOIN _walcast.snapshot_tables t USING (snapshot_id, schema_name,"
                "            table_name)"
                "       WHERE x.snapshot_id = %s AND x.state = 'pending'"
                "       ORDER BY t.ord, x.chunk LIMIT 1 FOR UPDATE OF x SKIP LOCKED) n"
                " WHERE (c.snapshot_id, c.schema_name, c.table_name, c.chunk)"
                "     = (n.snapshot_id, n.schema_name, n.table_name, n.chunk)"
                " RETURNING c.schema_name, c.table_name, c.chunk, c.relation, c.first_page,"
                "     c.end_page, c.lower_key, c.upper_key, c.only_keys, c.bounds, n.ranged",
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
                     bounds=str(row[9]), only_keys=row[8], byte_order=bool(row[10]))  # fmt: skip

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
                "   chunk, lower_key, upper_key, bounds, only_keys)"
                " SELECT c.snapshot_id, c.schema_name, c.table_name, (SELECT max(x.chunk) + 1"
                "   FROM _walcast.snapshot_chunks x WHERE (x.snapshot_id, x.schema_name,"
                "   x.table_name) = (c.snapshot_id, c.schema_name, c.table_name)),"
                "   c.lower_key, c.upper_key, c.bounds, %s"
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

    def table_key_ranges(self, job_id: int, schema: str, table: str) -> Any:
        row = self.conn.execute(
            "SELECT key_ranges FROM _walcast.snapshot_tables"
            " WHERE snapshot_id = %s AND schema_name = %s AND table_name = %s",
            [job_id, schema, table],
        ).fetchone()
        return row[0] if row else None

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
