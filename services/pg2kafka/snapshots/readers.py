"""Reader threads and processes: each claims chunks from the store, reads one in a short
transaction (under the exported snapshot while it exists), sends its rows through its
producer, and records the chunk done once Kafka acknowledged them."""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import psycopg
from psycopg import sql

from services.pg2kafka.changes import EventBuilder, append_only, iso_utc
from services.pg2kafka.debezium_format import DebeziumRecords
from services.pg2kafka.output import Oversized, connect_encoder, output_format, value_encoder
from services.pg2kafka.postgres import Catalog
from services.pg2kafka.replication import (
    SESSION_OPTIONS,
)
from services.pg2kafka.routing import Routing
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.snapshots.chunks import Chunk, Job, TableSpec, chunk_query, chunk_where
from services.pg2kafka.snapshots.rows import ChunkRows, DebeziumReads, ReadRecords, WalcastReads
from services.pg2kafka.snapshots.store import PostgresSnapshotStore, SnapshotStore
from services.pg2kafka.topics import StreamTarget, Topics, producer_config
from services.pg2kafka.transforms import from_settings
from services.pg2kafka.types import TypeRegistry
from shared.avro import Shape
from shared.contract.event import EVENT_VERSION, ChangeEvent, SnapshotInfo
from shared.errors import PermanentError, RetriableError, is_retriable, operator_hint
from shared.failpoints import failpoint
from shared.kafka import BulkKafkaSink
from shared.logs import configure_logging

log = logging.getLogger(__name__)

POLL_EVERY = 1000  # rows between two looks at Kafka's acknowledgements and the stop flag


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
        self.format = output_format(settings)
        # producer.encoding: JSON, or Avro with the same per-table schemas as the stream's.
        self.values = value_encoder(settings)

    def encode(
        self, topic: str, ev: ChangeEvent | dict[str, Any], shape: Shape | None = None
    ) -> bytes:
        """An event's record value in the producer's encoding (``shape``: see
        :meth:`shared.avro.RegistryEncoder.encode`)."""
        return self.values.encode(topic, ev, shape)

    def marker(
        self, db: str, schema: str, table: str, version: int, info: SnapshotInfo,
        shape: Shape | None = None,
    ) -> None:  # fmt: skip
        """A table's start or end marker, where :meth:`Routing.table_wide` says. The
        Debezium format has no such markers: nothing is written."""
        if not self.format.table_wide_events:
            return
        ev: ChangeEvent = {"v": EVENT_VERSION, "op": "snapshot", "db": db, "schema": schema,
                           "table": table, "lsn": version, "seq": 0, "commit_lsn": version,
                           "xid": 0, "commit_ts": iso_utc(time.time_ns() // 1000),
                           "key": {}, "new": None, "old": None, "snapshot": info}  # fmt: skip
        if self.epoch:
            ev["epoch"] = self.epoch
        topic = self.routing.topic(db, schema, table)
        value = self.encode(topic, ev, shape)
        where = self.routing.table_wide(schema, table, lambda: self.topics.refresh(topic))
        if where is None:
            self.sink.write(topic, value, self.routing.key(ev))
        for key, partition in where or ():
            self.sink.write(topic, value, key, partition)

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


class _Renamed(Exception):  # noqa: N818 - a signal inside this module, never raised out
    """The chunk's table is no longer under the name just looked up."""


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
        self.dropped: set[int] = set()  # relations found dropped: told once
        # every relation a chunk reads (a partitioned table's leaves), to its table
        self.by_leaf = {oid: t for t in tables.values() for oid, _ in t.leaves}
        # The format's records of the rows (services/pg2kafka/snapshots/rows.py).
        self.records: ReadRecords
        if producer.format.connect_records:
            self.records = DebeziumReads(
                DebeziumRecords(
                    settings.debezium,
                    settings.postgres.database,
                    self.builder.types,
                    self.catalog.not_null,
                    self.catalog.primary_key,
                    avro=connect_encoder(settings),
                    transforms=self.builder.transforms,
                ),
                job,
            )
        else:
            self.records = WalcastReads(
                settings.postgres.database, self.builder, producer.values, producer.routing,
                Oversized(producer.values),
            )  # fmt: skip

    def run(self) -> None:
        store = PostgresSnapshotStore(self.conninfo)
        try:
            with psycopg.connect(
                self.conninfo,
                autocommit=True,
                options=f"{SESSION_OPTIONS} {self.producer.format.session_options}".strip(),
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

    def read(
        self, conn: psycopg.Connection[Any], chunk: Chunk, version: int, *, again: bool = True
    ) -> int | None:
        """Send the chunk's rows to Kafka (not yet acknowledged); their count, or None
        when halted before the end. ``again``: a table renamed just before its read is
        read once more under its new name."""
        assert chunk.relation is not None  # the initial snapshot reads page ranges
        name = self._name(conn, chunk.relation)
        if name is None:
            return self._left(chunk, "dropped")
        spec = self.tables.get((chunk.schema, chunk.table)) or self.by_leaf.get(chunk.relation)
        if spec is None:
            return self._left(chunk, "taken out of the publication")
        # Renamed since the slot's point (the resumed run describes tables by their names
        # now): its rows still go out under the name the snapshot began with — the stream
        # carries the rename after them.
        rel = replace(spec.relation, schema=chunk.schema, table=chunk.table)
        made = self.records
        json_columns = made.json_columns(rel)
        # An insert-only table's rows are identified by their place in the chunk (``seq``):
        # read in ctid order, a chunk read again numbers them the same way.
        query = chunk_query(name, rel, chunk_where(conn, rel, chunk), json_columns,
                            by_ctid=append_only(rel))  # fmt: skip
        topic = made.topic(rel)
        at = ChunkRows(
            rel, json_columns, version, iso_utc(time.time_ns() // 1000),
            {"id": chunk.snapshot_id, "chunk": chunk.chunk}, self.job.epoch, topic,
            self.producer.topics.value_limit(topic),
        )  # fmt: skip
        sink = self.producer.sink
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
                if not self._still(conn, name, chunk.relation):
                    raise _Renamed
                send = made.begin(conn, at)
                with conn.cursor().copy(query) as copy:
                    copy.set_types(["text"] * (3 if json_columns else len(rel.columns)))
                    for sent in send(copy.rows(), sink, POLL_EVERY):
                        rows += sent
                        self.control.count(sent)
                        if sent < POLL_EVERY:
                            break  # the rows are done
                        sink.poll()
                        if self.control.halted():
                            halted = True
                            conn.cancel_safe()
                            break
        except psycopg.errors.QueryCanceled:
            if not halted:
                raise
        except (psycopg.errors.UndefinedTable, _Renamed):
            # dropped or renamed between the look-up and the read: no row of it was sent
            # (the statement failed before its first). Looked up again, now outside the
            # snapshot's transaction (whose catalog reads are the snapshot's):
            if self._name(conn, chunk.relation) is None:
                return self._left(chunk, "dropped")
            if not again:
                raise
            return self.read(conn, chunk, version, again=False)  # under its new name
        if halted:
            return None
        return rows

    def _name(self, conn: psycopg.Connection[Any], oid: int) -> sql.Composable | None:
        """The relation's name now; None when it was dropped (an OID never comes back).
        Looked up for every chunk: a table dropped and created again under its name is
        another relation, whose rows are not this snapshot's."""
        row = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
            [oid],
        ).fetchone()
        return None if row is None else sql.Identifier(str(row[0]), str(row[1]))

    @staticmethod
    def _still(conn: psycopg.Connection[Any], name: sql.Composable, oid: int) -> bool:
        """Whether ``name`` still is relation ``oid``, which then cannot be dropped before
        the chunk's transaction ends (locked as the read would lock it)."""
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(name))
        row = conn.execute("SELECT pg_catalog.to_regclass(%s)::oid", [name.as_string(conn)])
        return bool(row.fetchone() == (oid,))

    def _left(self, chunk: Chunk, why: str) -> int:
        """A chunk of a table dropped (or taken out of the publication) after the slot's
        point: its rows can no longer be read, and need not be — the stream carries the
        ``DROP TABLE`` and whatever came after it (a table created again under the name is
        streamed from its creation). The chunk is done with no rows, so the table's
        snapshot ends and streaming starts; a sink that keeps dropped tables
        (kafka2postgres' ``target.on_drop_table=ignore``) holds only the rows read before
        the drop and those changed after the slot's point."""
        if chunk.relation not in self.dropped:
            self.dropped.add(chunk.relation or 0)
            log.warning("snapshot %d: %s.%s was %s after the slot's point: its chunks left"
                        " are done without rows (the stream carries what became of it)",
                        chunk.snapshot_id, chunk.schema, chunk.table, why)  # fmt: skip
        return 0


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
