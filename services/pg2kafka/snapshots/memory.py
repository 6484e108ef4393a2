"""A :class:`~services.pg2kafka.snapshots.store.SnapshotStore` in memory: the same runs,
tables and chunks as the Postgres tables hold, behind one lock, so claiming, recording
and resuming are tested without a database (``tests/snapshot_store_contract.py`` holds it
and the Postgres store to the same behaviour). Share one instance between the "readers"
of a test; ``slots`` stands for ``pg_replication_slots`` (slot → restart position, None
for an invalidated slot)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.pg2kafka.replication import Identity
from services.pg2kafka.snapshots.chunks import Bounds, Chunk, Job, TableSpec
from shared.errors import PermanentError, RetriableError

if TYPE_CHECKING:
    from services.pg2kafka.snapshots.store import SnapshotStore

TableId = tuple[int, str, str]  # (run, schema, table)


@dataclass
class _Run:
    slot: str
    kind: str
    version: int
    state: str
    started_us: int


@dataclass
class _Table:
    ord: int
    rows_estimate: int | None
    chunks_total: int
    start_version: int
    chunks_done: int = 0
    rows_done: int = 0
    state: str = "pending"
    floor: int | None = None
    key_ranges: Any = None
    started: float | None = None
    finished: float | None = None


@dataclass
class _Chunk:
    relation: int | None
    first_page: int | None
    end_page: int | None
    lower_key: list[str] | None
    upper_key: list[str] | None
    bounds: str = "[)"
    only_keys: list[str] | None = None
    state: str = "pending"
    rows: int = 0


class InMemorySnapshotStore:
    """Runs, tables and chunks in dictionaries; every method holds the lock throughout,
    as each Postgres method is one transaction."""

    def __init__(self, slots: dict[str, int | None] | None = None, epoch: int = 0) -> None:
        self.slots: dict[str, int | None] = {} if slots is None else slots
        self.epoch = epoch
        self.lock = threading.Lock()
        self.runs: dict[int, _Run] = {}
        self.tables: dict[TableId, _Table] = {}
        self.chunks: dict[tuple[int, str, str, int], _Chunk] = {}
        self.recorded_floors: dict[tuple[str, str, str], int] = {}

    def close(self) -> None:
        """Nothing to release (the state outlives the handle, as a database's does)."""

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
        with self.lock:
            job_id = max(self.runs, default=0) + 1
            started_us = time.time_ns() // 1000
            self.runs[job_id] = _Run(slot, kind, version, "running", started_us)
            for ord_, spec in enumerate(tables):
                planned = planner(spec)
                self.tables[(job_id, spec.schema, spec.name)] = _Table(
                    ord_, spec.rows_estimate, len(planned), version
                )
                self.tables[(job_id, spec.schema, spec.name)].key_ranges = (key_ranges or {}).get(
                    (spec.schema, spec.name)
                )
                for n, (rel, first, end, lo, hi, bounds) in enumerate(planned):
                    self.chunks[(job_id, spec.schema, spec.name, n)] = _Chunk(
                        rel, first, end, lo, hi, bounds
                    )
            return Job(job_id, slot, kind, version, "running", self.epoch, started_us)

    def unfinished(self, slot: str, kind: str) -> Job | None:
        with self.lock:
            for job_id in sorted(self.runs, reverse=True):
                run = self.runs[job_id]
                if (run.slot, run.kind, run.state) == (slot, kind, "running"):
                    return Job(job_id, slot, kind, run.version, run.state, self.epoch,
                               run.started_us)  # fmt: skip
            return None

    def state(self, job: Job) -> str:
        with self.lock:
            run = self.runs.get(job.id)
            return "failed" if run is None else run.state

    def finish(self, job: Job, state: str, error: str | None = None) -> None:
        with self.lock:
            run = self.runs.get(job.id)
            if run is not None and run.state == "running":
                run.state = state

    def requeue_running(self, job: Job) -> int:
        with self.lock:
            claimed = [c for k, c in self.chunks.items() if k[0] == job.id and c.state == "running"]
            for c in claimed:
                c.state = "pending"
            return len(claimed)

    def claim(self, job: Job) -> Chunk | None:
        with self.lock:
            pending = [
                (self.tables[k[:3]].ord, k[3], k)
                for k, c in self.chunks.items()
                if k[0] == job.id and c.state == "pending"
            ]
            if not pending:
                return None
            _ord, _n, key = min(pending)
            c = self.chunks[key]
            c.state = "running"
            table = self.tables[key[:3]]
            if table.state == "pending":
                table.state, table.started = "running", time.monotonic()
            return Chunk(job.id, key[1], key[2], key[3], c.relation, c.first_page, c.end_page,
                         c.lower_key, c.upper_key, c.bounds, c.only_keys,
                         table.key_ranges is not None)  # fmt: skip

    def chunk_done(self, chunk: Chunk, rows: int, version: int) -> bool:
        with self.lock:
            key = (chunk.snapshot_id, chunk.schema, chunk.table, chunk.chunk)
            c = self.chunks.get(key)
            table = self.tables.get(key[:3])
            if c is None or c.state == "done" or table is None:
                return False
            c.state, c.rows = "done", rows
            table.rows_done += rows
            table.chunks_done += 1
            return table.chunks_done >= table.chunks_total

    def read_again(self, chunk: Chunk, keys: list[str]) -> int | None:
        with self.lock:
            key = (chunk.snapshot_id, chunk.schema, chunk.table, chunk.chunk)
            c = self.chunks.get(key)
            if c is None:
                return None
            number = max(k[3] for k in self.chunks if k[:3] == key[:3]) + 1
            self.chunks[(*key[:3], number)] = _Chunk(
                None, None, None, c.lower_key, c.upper_key, c.bounds, list(keys)
            )
            self.tables[key[:3]].chunks_total += 1
            return number

    def tables_to_close(self, job: Job) -> list[tuple[str, str, int, int]]:
        with self.lock:
            found = [
                (t.ord, k[1], k[2], t.start_version, t.rows_done)
                for k, t in self.tables.items()
                if k[0] == job.id and t.chunks_done >= t.chunks_total and t.state != "done"
            ]
            return [
                (schema, table, start, rows) for _o, schema, table, start, rows in sorted(found)
            ]

    def table_done(self, job: Job, schema: str, table: str) -> None:
        with self.lock:
            t = self.tables.get((job.id, schema, table))
            if t is not None:
                t.state, t.finished = "done", time.monotonic()

    def requeue(self, chunk: Chunk) -> None:
        with self.lock:
            c = self.chunks.get((chunk.snapshot_id, chunk.schema, chunk.table, chunk.chunk))
            if c is not None and c.state == "running":
                c.state = "pending"

    def running_incremental(self, slot: str) -> list[Job]:
        with self.lock:
            return [
                Job(job_id, slot, "incremental", run.version, "running", self.epoch)
                for job_id, run in sorted(self.runs.items())
                if (run.slot, run.kind, run.state) == (slot, "incremental", "running")
            ]

    def table_counts(self, job_id: int, schema: str, table: str) -> tuple[int, int]:
        with self.lock:
            t = self.tables.get((job_id, schema, table))
            return (t.chunks_total - t.chunks_done, t.rows_done) if t else (0, 0)

    def start_version(self, job_id: int, schema: str, table: str) -> int:
        with self.lock:
            t = self.tables.get((job_id, schema, table))
            return t.start_version if t else 0

    def table_key_ranges(self, job_id: int, schema: str, table: str) -> Any:
        with self.lock:
            t = self.tables.get((job_id, schema, table))
            return t.key_ranges if t else None

    def floors(self, slot: str) -> dict[tuple[str, str], int]:
        with self.lock:
            out: dict[tuple[str, str], int] = {}
            for (job_id, schema, table), t in self.tables.items():
                run = self.runs[job_id]
                if run.slot == slot and run.state == "running" and t.floor is not None:
                    out[(schema, table)] = max(out.get((schema, table), 0), t.floor)
            for (s, schema, table), lsn in self.recorded_floors.items():
                if s == slot:
                    out[(schema, table)] = max(out.get((schema, table), 0), lsn)
            return out

    def record_floor(self, slot: str, schema: str, table: str, lsn: int) -> None:
        with self.lock:
            key = (slot, schema, table)
            self.recorded_floors[key] = max(self.recorded_floors.get(key, lsn), lsn)
            for (job_id, s, t), spec in self.tables.items():
                run = self.runs[job_id]
                if (s, t) == (schema, table) and run.slot == slot and run.state == "running":
                    spec.floor = lsn

    def finish_if_complete(self, job_id: int) -> bool:
        with self.lock:
            run = self.runs.get(job_id)
            if run is None or run.state != "running":
                return False
            if any(t.state != "done" for k, t in self.tables.items() if k[0] == job_id):
                return False
            run.state = "done"
            return True

    def progress(self, job: Job) -> list[dict[str, Any]]:
        with self.lock:
            now = time.monotonic()
            tables = sorted((t.ord, k, t) for k, t in self.tables.items() if k[0] == job.id)
            return [
                {
                    "table": f"{k[1]}.{k[2]}",
                    "state": t.state,
                    "rows": t.rows_done,
                    "estimate": t.rows_estimate,
                    "chunks_done": t.chunks_done,
                    "chunks": t.chunks_total,
                    "seconds": None if t.started is None else (t.finished or now) - t.started,
                }
                for _o, k, t in tables
            ]

    def restart_lsn(self, slot: str) -> int:
        with self.lock:
            if slot not in self.slots:
                raise RetriableError(f"replication slot {slot!r} is gone")
            lsn = self.slots[slot]
            if lsn is None:
                raise PermanentError(
                    f"replication slot {slot!r} has no restart_lsn (it was invalidated)",
                    hint="recreate the slot: pg2kafka tear-down, then run (a new initial snapshot)",
                )
            return lsn

    def slot_exists(self, slot: str) -> bool:
        with self.lock:
            return slot in self.slots


if TYPE_CHECKING:  # mypy holds the class to the protocol
    _conforms: SnapshotStore = InMemorySnapshotStore()
