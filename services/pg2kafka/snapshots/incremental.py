"""Incremental snapshots: tables snapshotted on a running pipeline, chunk by chunk, without
pausing the stream and without a long transaction (DBLog, Netflix 2019). (A little over
600 lines: the stream's hooks and the reader threads share one class's state — windows,
reads waiting for their watermark — which a split by job would pass back and forth.)

Requests arrive in ``_walcast.snapshot_requests`` (the signal table): from
``pg2kafka snapshot --table``, from an operator's INSERT, from the DDL trigger when a
table joins the publication with rows in it (it gained a key or an identity: ``pgbench
-i``, ``pg_restore``), and from ``init`` when the filters grow. The CDC stream takes them
every few seconds and plans a run: key ranges of each keyed table (page ranges of a
table keyed by its whole row), ``snapshot.chunk_rows`` rows each.

A reader thread handles one chunk at a time:

1. writes a *low watermark* into the WAL (a transactional logical message);
2. reads the slot's ``restart_lsn`` (the chunk's version, minus one: see
   docs/snapshots-design.md) and the chunk's rows, in one short transaction;
3. hands the rows to the stream and writes a *high watermark*.

The stream sees the low watermark, then every change committed meanwhile, then the high
watermark. A row whose key changed between the two is dropped from the chunk — the
stream carried that change already, and a read row of a deleted key must not bring it
back; when the change was an update that left a TOAST value out, the key is read again
in a later chunk of its own (V019), since a sink that never held the row cannot complete
it from that change — and the chunk's other rows are sent right there, in the stream's
order, as part of the high watermark's transaction: the slot's position passes the chunk only once
Kafka acknowledged its rows (checkpoint last), and the chunk is recorded done after
that. A crash before then reads the chunk again. A chunk whose low watermark this
session did not see (it reconnected in between), or whose table was truncated inside the
window, is read again.

A chunk's version is above the table's last truncate or re-creation the stream saw
(``floor``): sinks keep only what is newer than a truncate.

(A little over 600 lines: the watermark protocol above is one state machine — the
session-thread hooks and the reader threads share its windows under one lock — and reads
best in one file; chunk planning lives in ``chunks.py``.)
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import psycopg
from psycopg import sql

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder, iso_utc
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.output import output_format
from services.pg2kafka.postgres import Catalog
from services.pg2kafka.replication import SESSION_OPTIONS, format_lsn, identify_system
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.snapshots.chunks import (
    Bounds,
    Chunk,
    Job,
    TableSpec,
    chunk_where,
    describe_tables,
    key_ranges,
    plan_chunks,
    ranged_chunks,
)
from services.pg2kafka.snapshots.initial import start_markers
from services.pg2kafka.snapshots.progress import Progress
from services.pg2kafka.snapshots.store import PostgresSnapshotStore, SnapshotStore
from services.pg2kafka.transforms import from_settings
from services.pg2kafka.types import TypeRegistry
from shared.contract.event import ChangeEvent, SnapshotInfo, read_row_version
from shared.contract.keyranges import KeyRangesJson
from shared.failpoints import failpoint

if TYPE_CHECKING:
    from services.pg2kafka.metrics import Metrics
    from services.pg2kafka.session import HandlerContext

log = logging.getLogger(__name__)

WATERMARK = "walcast.snapshot"
REQUEST_POLL_S = 2.0
ChunkId = tuple[int, str, str, int]  # (run, schema, table, chunk)


TextRow = tuple[str | None, ...]
"""A row's columns as Postgres's text output (None: NULL), as a chunk's COPY gives them."""


def chunk_id(chunk: Chunk) -> ChunkId:
    return (chunk.snapshot_id, chunk.schema, chunk.table, chunk.chunk)


class Sender(Protocol):
    """What an incremental snapshot sends its rows and markers through (the CDC handler:
    the stream's own path, so a row goes out in the stream's order, encoded and routed as
    every change)."""

    def send_read(
        self, session: HandlerContext, rel: pg.Relation, values: TextRow, ev: ChangeEvent
    ) -> None:
        """A read row, to its partition (by the configured key), in the format's records:
        ``ev`` walcast's event of it (its version in ``lsn``), ``values`` the columns' text
        it was built from (what a format that builds its own records reads)."""

    def send_table_wide(self, session: HandlerContext, ev: ChangeEvent) -> None:
        """A whole table's event (a snapshot's end marker), to every partition its rows
        can be in."""


@dataclass
class Window:
    """What the stream carried for a chunk's table between the chunk's watermarks."""

    changed: set[bytes] = field(default_factory=set)  # keys (JSON) of every change
    partial: set[bytes] = field(default_factory=set)  # ... of updates without a TOAST value
    truncated: bool = False  # or created again: the chunk is read again whole


def event_key(ev: ChangeEvent) -> bytes:
    """A change's or read row's key as the window compares them (and V019 stores them)."""
    return orjson.dumps(ev.get("key") or ev.get("new") or ev.get("old"))


@dataclass
class ChunkRead:
    """A chunk's rows, read and waiting for their high watermark."""

    chunk: Chunk
    version: int
    events: list[ChangeEvent]
    rel: pg.Relation
    texts: list[TextRow]  # each event's columns as read (text), in the same order
    taken: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # "sent" or "again"


class Incremental:
    """The incremental snapshots of one CDC stream; lives across its sessions. Hooks
    (``changed``, ``floor``, ``watermark``, ``housekeeping``, ``session_ended``) run on the
    session's thread; readers on their own."""

    def __init__(
        self, settings: Pg2KafkaSettings, stop: threading.Event, metrics: Metrics | None = None
    ) -> None:
        self.settings = settings
        self.stop = stop
        self.metrics = metrics
        self.progress: dict[int, Progress] = {}  # run -> its progress reporting
        self.conninfo = settings.postgres.conninfo()
        self.filter = TableFilter(settings.filters.include, settings.filters.exclude)
        self.lock = threading.Lock()
        self.reads: dict[ChunkId, ChunkRead] = {}
        # The read attempt each chunk's reader is making now (a token in its watermarks):
        # only that attempt's low watermark opens the chunk's window and only its high one
        # closes it. The marks of an earlier attempt — streamed again after a reconnect,
        # or written by an earlier process — open and close nothing.
        self.reading: dict[ChunkId, str] = {}
        self.windows: dict[ChunkId, Window] = {}
        self.window_tables: dict[tuple[str, str], list[ChunkId]] = {}
        self.floors: dict[tuple[str, str], int] = {}
        self.sent: list[tuple[int, ChunkRead, int]] = []  # (txn seq, read, rows) unconfirmed
        self.remaining: dict[tuple[int, str, str], int] = {}  # chunks not yet sent
        self.table_rows: dict[tuple[int, str, str], int] = {}  # rows sent
        self.readers: list[threading.Thread] = []
        self.store: PostgresSnapshotStore | None = None
        self.next_poll = 0.0
        self.floors_loaded = False
        self.resumed = False  # chunks a dead leader held were requeued (once per process)
        self.disabled = False  # the role may not use the snapshot tables
        self.epoch = 0  # the source's epoch (services/pg2kafka/source.py), set per leadership

    # -- on the session's thread ---------------------------------------------------------

    def changed(self, ev: ChangeEvent) -> None:
        """A change the stream sent: inside a chunk's window, its key leaves the chunk."""
        ids = self.window_tables.get((ev["schema"], ev["table"]))
        if ids:
            key = event_key(ev)
            partial = bool(ev.get("unchanged_toast"))
            for cid in ids:
                window = self.windows[cid]
                window.changed.add(key)
                if partial:
                    window.partial.add(key)

    def floor(self, schema: str, table: str, lsn: int) -> None:
        """The table was truncated or created again at ``lsn``."""
        where = (schema, table)
        self.floors[where] = max(self.floors.get(where, 0), lsn)
        for cid in self.window_tables.get(where, []):
            self.windows[cid].truncated = True
        if self.disabled:
            return
        self._store().record_floor(self.settings.replication.slot, schema, table, lsn)

    def watermark(
        self, session: HandlerContext, handler: Sender, lsn: int, msg: pg.Message
    ) -> None:
        try:
            mark = orjson.loads(msg.content)
            cid: ChunkId = (int(mark["run"]), str(mark["schema"]), str(mark["table"]),
                            int(mark["chunk"]))  # fmt: skip
            kind = mark["mark"]
            attempt = str(mark.get("attempt"))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            log.warning("ignoring a malformed snapshot watermark at %s", format_lsn(lsn))
            return
        with self.lock:
            ours = self.reading.get(cid) == attempt
        if not ours:
            return  # not the attempt a reader of this process is making now
        if kind == "low":
            self.windows[cid] = Window()
            ids = self.window_tables.setdefault(cid[1:3], [])
            if cid not in ids:
                ids.append(cid)
            return
        window = self.windows.pop(cid, None)
        ids = self.window_tables.get(cid[1:3], [])
        if cid in ids:
            ids.remove(cid)
            if not ids:
                del self.window_tables[cid[1:3]]
        with self.lock:
            read = self.reads.pop(cid, None)
        if read is None:
            return  # a reader of an earlier run of this process, or of another process
        if window is None or window.truncated:
            read.outcome = "again"  # the window is not whole: read it again
            read.taken.set()
            return
        # Above the table's last truncate or re-creation: sinks keep only what is newer
        # than a truncate. (No change of the table can sit between the truncate's record
        # and the next: the truncate's lock waited for every transaction writing it.)
        floor = self.floors.get(cid[1:3])
        version = read_row_version(read.version, floor)
        rows = 0
        again: list[str] = []
        for ev, values in zip(read.events, read.texts, strict=True):
            key = event_key(ev)
            if key in window.changed:
                if key in window.partial:
                    again.append(key.decode())
                continue
            ev["lsn"] = ev["commit_lsn"] = version
            handler.send_read(session, read.rel, values, ev)
            rows += 1
        table = (cid[0], cid[1], cid[2])
        if table not in self.remaining:
            self.remaining[table], self.table_rows[table] = self._store().table_counts(*table)
        if again:
            self._read_again(read.chunk, again, table)
        self.remaining[table] -= 1
        self.table_rows[table] += rows
        if self.remaining[table] <= 0:
            # Above the table's floor too: a sink ignores an end marker at or below it.
            start = read_row_version(self._store().start_version(*table), floor)
            ranges = self._store().table_key_ranges(*table)
            marker = end_marker(self.settings, cid, start, self.table_rows[table], ranges)
            handler.send_table_wide(session, marker)
        self.sent.append((session.transaction, read, rows))
        read.outcome = "sent"
        read.taken.set()
        failpoint("incremental.chunk_sent")  # sent, not yet acknowledged nor recorded

    def _read_again(self, chunk: Chunk, keys: list[str], table: tuple[int, str, str]) -> None:
        """Rows dropped from ``chunk`` because an update in its window left a TOAST value
        out: their keys, read again in a later window (a sink that never held such a row
        gets it whole from that read, or fills the value the update left out)."""
        if chunk.first_page is not None:
            # A page range: the updated row may have moved to any page. Not read again
            # (docs/snapshots.md: tables chunked by pages).
            log.warning("incremental snapshot %d: %d row(s) of %s.%s updated inside a chunk's"
                        " window without their TOAST values are not read again (the table"
                        " is read by pages)", chunk.snapshot_id, len(keys), chunk.schema,
                        chunk.table)  # fmt: skip
            return
        number = self._store().read_again(chunk, keys)
        if number is None:
            return
        self.remaining[table] += 1
        log.info("incremental snapshot %d: %d key(s) of %s.%s chunk %d read again as chunk %d"
                 " (updated inside its window without their TOAST values)", chunk.snapshot_id,
                 len(keys), chunk.schema, chunk.table, chunk.chunk, number)  # fmt: skip

    def housekeeping(self, session: HandlerContext, handler: Sender) -> None:
        """Record the chunks Kafka acknowledged (their transaction is confirmable), take
        new requests, keep readers running while there is work. A role that may not use
        the snapshot tables (pg2kafka not run as their owner, or migrations older than
        V010) streams on without incremental snapshots, told once."""
        if self.disabled:
            return
        try:
            self._housekeeping(session, handler)
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedTable) as exc:
            self.disabled = True
            log.warning(
                "incremental snapshots off: %s (run pg2kafka as the role that ran init, or"
                " grant it the _walcast snapshot tables)",
                str(exc).splitlines()[0],
            )

    def _housekeeping(self, session: HandlerContext, handler: Sender) -> None:
        if not self.floors_loaded:
            store = self._store()
            self.floors = store.floors(self.settings.replication.slot)
            self.floors_loaded = True
            if not self.resumed:
                # Chunks a dead leader's readers held (this process leads now): again.
                self.resumed = True
                for job in store.running_incremental(self.settings.replication.slot):
                    if n := store.requeue_running(job):
                        log.info("incremental snapshot %d resumed: %d chunk(s) to read again",
                                 job.id, n)  # fmt: skip
        if self.sent:
            store = self._store()
            still = []
            for seq, read, rows in self.sent:
                if not session.acknowledged(seq):
                    still.append((seq, read, rows))
                    continue
                c = read.chunk
                if store.chunk_done(c, rows, read.version):
                    store.table_done(Job(c.snapshot_id, "", "", 0, ""), c.schema, c.table)
                    log.info("incremental snapshot of %s.%s done", c.schema, c.table)
                    if store.finish_if_complete(c.snapshot_id):
                        self.report(store, c.snapshot_id, final=True)
                failpoint("incremental.chunk_done")
            self.sent = still
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + REQUEST_POLL_S
            self.take_requests()
            for job in self._store().running_incremental(self.settings.replication.slot):
                self.report(self._store(), job.id)
            self.readers = [t for t in self.readers if t.is_alive()]
            if not self.readers and self._store().running_incremental(
                self.settings.replication.slot
            ):
                for n in range(self.settings.snapshot.workers):
                    t = threading.Thread(target=self.read_chunks, name=f"incremental-{n}",
                                         daemon=True)  # fmt: skip
                    t.start()
                    self.readers.append(t)

    def report(self, store: SnapshotStore, run: int, final: bool = False) -> None:
        """The run's progress in the log and the metrics (``Progress`` decides when)."""
        if self.metrics is None:
            return
        progress = self.progress.get(run)
        if progress is None:
            job = Job(run, self.settings.replication.slot, "incremental", 0, "running")
            progress = self.progress[run] = Progress(self.settings, self.metrics, job)
        progress.report(store.progress(progress.job), final=final)
        if final:
            del self.progress[run]

    def session_ended(self) -> None:
        """Chunks sent but not confirmed, and open windows, die with the session: read
        them again."""
        store = self._store()
        for _, read, _ in self.sent:
            store.requeue(read.chunk)
        self.sent = []
        self.windows.clear()
        self.window_tables.clear()
        self.remaining.clear()
        self.table_rows.clear()
        self.floors_loaded = False
        with self.lock:
            waiting = list(self.reads.values())
            self.reads.clear()
        for read in waiting:
            read.outcome = "again"
            read.taken.set()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def _store(self) -> PostgresSnapshotStore:
        if self.store is None or self.store.conn.closed:
            self.store = PostgresSnapshotStore(self.conninfo, self.epoch)
        self.store.epoch = self.epoch  # a new leadership may have found a new source
        return self.store

    # -- requests ------------------------------------------------------------------------

    def take_requests(self) -> None:
        """Plan one run for the requests waiting for this publication."""
        s = self.settings
        store = self._store()
        conn = store.conn
        with conn.transaction():
            rows = conn.execute(
                "SELECT id, schema_name, table_name, reason, key_ranges"
                " FROM _walcast.snapshot_requests WHERE publication = %s AND taken_at IS NULL"
                # a repair's: once the slot is past it (V021), its rows above what it mends
                "  AND (after_lsn IS NULL OR after_lsn < (SELECT restart_lsn FROM"
                "       pg_catalog.pg_replication_slots WHERE slot_name = %s))"
                " ORDER BY id FOR UPDATE SKIP LOCKED",
                [s.replication.publication, s.replication.slot],
            ).fetchall()
            if not rows:
                return
            wanted: dict[tuple[str, str], list[int]] = {}
            # Tables asked for by key ranges only (V021, `repair`): their ranges; a table
            # also asked for whole is read whole.
            ranged: dict[tuple[str, str], KeyRangesJson | None] = {}
            declined = []
            for rid, schema, table, reason, ranges in rows:
                if not s.snapshot.automatic and str(reason).startswith("joined"):
                    declined.append(rid)
                    continue
                where = (str(schema), str(table))
                wanted.setdefault(where, []).append(int(rid))
                if ranges is None or ranged.get(where, ranges) is None:
                    ranged[where] = None
                elif (had := ranged.get(where)) is not None and had["columns"] == ranges["columns"]:
                    had["ranges"].extend(ranges["ranges"])
                else:
                    ranged[where] = {"columns": ranges["columns"], "ranges": list(ranges["ranges"])}
            if declined:
                log.info("%d automatic snapshot request(s) declined (snapshot.automatic"
                         " is off)", len(declined))  # fmt: skip
                conn.execute(
                    "UPDATE _walcast.snapshot_requests SET taken_at = now() WHERE id = ANY(%s)",
                    [declined],
                )
            if not wanted:
                return
            tables = describe_tables(conn, s.replication.publication, self.filter, set(wanted))
            found = {(t.schema, t.name) for t in tables}
            for where, ids in wanted.items():
                if where not in found:
                    log.warning(
                        "snapshot of %s.%s not possible: not in publication %s (not matched by"
                        " the filters, or without a replica identity)",
                        where[0], where[1], s.replication.publication,
                    )  # fmt: skip
                    conn.execute(
                        "UPDATE _walcast.snapshot_requests SET taken_at = now() WHERE id = ANY(%s)",
                        [ids],
                    )
            if not tables:
                return
            version = store.restart_lsn(s.replication.slot) - 1
            chunk_rows = s.snapshot.chunk_rows
            pages = s.snapshot.chunk_pages

            by_range = {w: r for w, r in ranged.items() if r is not None and w in found}

            def planner(t: TableSpec) -> list[Bounds]:
                keyed = any(c.is_key for c in t.relation.columns)
                whole_row = all(c.is_key for c in t.relation.columns)
                if (t.schema, t.name) in by_range:
                    return ranged_chunks(conn, t, chunk_rows, by_range[(t.schema, t.name)])
                if keyed and not whole_row:
                    return key_ranges(conn, t, chunk_rows)
                return plan_chunks(t, pages)

            system = identify_system(self.conninfo)
            job = store.create(s.replication.slot, "incremental", version, tables, planner,
                               "request", system, by_range)  # fmt: skip
            conn.execute(
                "UPDATE _walcast.snapshot_requests SET taken_at = now(), taken_by = %s"
                " WHERE id = ANY(%s)",
                [job.id, [i for w in found for i in wanted.get(w, [])]],
            )
        log.info(
            "incremental snapshot %d of %s, version %s",
            job.id, ", ".join(f"{t.schema}.{t.name}" for t in tables), format_lsn(version),
        )  # fmt: skip
        start_markers(s, job, tables, system)

    # -- readers -------------------------------------------------------------------------

    def read_chunks(self) -> None:
        """A reader thread: chunks of the running incremental runs until none is left."""
        s = self.settings
        store = PostgresSnapshotStore(self.conninfo)
        catalog = Catalog(self.conninfo)
        builder = EventBuilder(
            s.postgres.database,
            TypeRegistry(catalog.type_info),
            primary_key=catalog.primary_key,
            transforms=from_settings(s.transforms),
        )
        chunk: Chunk | None = None
        try:
            options = f"{SESSION_OPTIONS} {output_format(s).session_options}".strip()
            with psycopg.connect(self.conninfo, autocommit=True, options=options,
                                 application_name=f"pg2kafka-snapshot:{s.replication.slot}"
                                 ) as conn:  # fmt: skip
                while not self.stop.is_set():
                    runs = store.running_incremental(s.replication.slot)
                    chunk = next((c for r in runs if (c := store.claim(r)) is not None), None)
                    if chunk is None:
                        return
                    if not self.read_chunk(conn, store, builder, chunk):
                        store.requeue(chunk)
                    chunk = None
        except Exception:
            # The next housekeeping round starts a reader again; the chunk is read again.
            log.exception("incremental snapshot reader failed; it starts again")
            if chunk is not None:
                with contextlib.suppress(psycopg.Error):
                    store.requeue(chunk)
        finally:
            store.close()
            catalog.close()

    def read_chunk(
        self,
        conn: psycopg.Connection[Any],
        store: SnapshotStore,
        builder: EventBuilder,
        chunk: Chunk,
    ) -> bool:
        """Read one chunk between its watermarks and wait for the stream to take it; False
        when it must be read again."""
        s = self.settings
        specs = describe_tables(conn, s.replication.publication, self.filter,
                                {(chunk.schema, chunk.table)})  # fmt: skip
        if not specs:
            log.warning("%s.%s left the publication: its snapshot ends", chunk.schema,
                        chunk.table)  # fmt: skip
            store.chunk_done(chunk, 0, 0)
            return True
        rel = specs[0].relation
        cid = chunk_id(chunk)
        attempt = secrets.token_hex(8)
        with self.lock:
            self.reading[cid] = attempt
        try:
            return self._read_between_marks(conn, store, builder, chunk, rel, cid, attempt)
        finally:
            with self.lock:
                if self.reading.get(cid) == attempt:
                    del self.reading[cid]

    def _read_between_marks(
        self,
        conn: psycopg.Connection[Any],
        store: SnapshotStore,
        builder: EventBuilder,
        chunk: Chunk,
        rel: pg.Relation,
        cid: ChunkId,
        attempt: str,
    ) -> bool:
        s = self.settings
        mark = {"run": chunk.snapshot_id, "schema": chunk.schema, "table": chunk.table,
                "chunk": chunk.chunk, "attempt": attempt}  # fmt: skip
        emit = "SELECT _walcast.emit_message(%s, %s)"  # signed: services/pg2kafka/messages.py
        conn.execute(emit, [WATERMARK, orjson.dumps({**mark, "mark": "low"}).decode()])
        version = store.restart_lsn(s.replication.slot) - 1
        table: sql.Composable = sql.Identifier(chunk.schema, chunk.table)
        if chunk.relation is not None:
            row = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN"
                " pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s",
                [chunk.relation],
            ).fetchone()
            if row is None:
                return False
            table = sql.SQL("ONLY {}").format(sql.Identifier(str(row[0]), str(row[1])))
        where = chunk_where(conn, rel, chunk)
        cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in rel.columns)
        query = sql.SQL("SELECT {} FROM {} WHERE {}").format(cols, table, where)
        read_at = iso_utc(time.time_ns() // 1000)
        info: SnapshotInfo = {"id": chunk.snapshot_id, "chunk": chunk.chunk}
        events = []
        texts: list[TextRow] = []
        with conn.transaction(), conn.cursor(binary=False) as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            for n, values in enumerate(_text_rows(cur, query, len(rel.columns))):
                events.append(builder.read(rel, values, version, n, read_at, info))
                texts.append(tuple(values))
        if chunk.only_keys is not None:  # keys read again (V019): only those of the range
            wanted = {k.encode() for k in chunk.only_keys}
            kept = [i for i, ev in enumerate(events) if event_key(ev) in wanted]
            events, texts = [events[i] for i in kept], [texts[i] for i in kept]
        read = ChunkRead(chunk, version, events, rel, texts)
        with self.lock:
            self.reads[cid] = read
        failpoint("incremental.chunk_read")  # read, its high watermark not yet written
        conn.execute(emit, [WATERMARK, orjson.dumps({**mark, "mark": "high"}).decode()])
        while not read.taken.wait(0.5):
            if self.stop.is_set():
                return False
        return read.outcome == "sent"


def _text_rows(cur: psycopg.Cursor[Any], query: sql.Composable, width: int) -> Any:
    """The rows as the server's text output (what pgoutput sends), column by column."""
    with cur.copy(sql.SQL("COPY ({}) TO STDOUT").format(query)) as copy:
        copy.set_types(["text"] * width)
        yield from copy.rows()


def end_marker(
    settings: Pg2KafkaSettings,
    cid: ChunkId,
    start: int,
    rows: int,
    key_ranges: KeyRangesJson | None = None,
) -> ChangeEvent:
    """A table's end marker; ``key_ranges``: of a snapshot of those key ranges only (its
    sweep is theirs: shared/contract/keyranges.py)."""
    info: SnapshotInfo = {"id": cid[0], "phase": "end", "rows": rows}
    if key_ranges is not None:
        info["phase"] = "range_end"
        info["key_ranges"] = key_ranges
    return {"v": 1, "op": "snapshot", "db": settings.postgres.database, "schema": cid[1],
            "table": cid[2], "lsn": start, "seq": 0, "commit_lsn": start, "xid": 0,
            "commit_ts": iso_utc(time.time_ns() // 1000), "key": {}, "new": None,
            "old": None, "snapshot": info}  # fmt: skip


__all__ = ["WATERMARK", "Incremental"]
