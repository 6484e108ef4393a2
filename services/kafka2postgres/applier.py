"""The target side of the consumer loop, a :class:`~shared.interfaces.BatchSink`: each
batch applied in one target transaction, per table one set-based statement
(:mod:`services.kafka2postgres.statements`) inside a savepoint, so that a table the
target refuses for good stops alone while the others commit.

* ``add`` (the loop's thread): a row older than a rename or drop gets it
  (:mod:`shared.contract.moves`); a stopped table's records are refused with its reason
  (dead-lettered); the rest folded into the batch (:mod:`.batch`);
* ``write`` (a writer thread): waits for the writes handed over before it — target
  transactions commit in the order of the stream — then, in one transaction, makes the
  tables it needs (:mod:`.tables`), adds the columns rows carry, applies each table's
  rows. Offsets are committed by the loop only after this returned: after the commit;
* ``control`` (the loop's thread, nothing in flight): truncates, snapshot markers and
  schema changes, each in its own transaction with its bookkeeping.

Failure: a connection or server failure raises (the loop backs off, reconnects and reads
the uncommitted records again — every statement is versioned, so nothing applies
twice). A permanent error of one table (a constraint the source does not have, a type
clash, a type missing in the target) stops that table — or, with
``target.on_table_error = stop_service``, the service — with what to fix.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

import psycopg
from psycopg import sql

from services.kafka2postgres.batch import Batch, TableBatch
from services.kafka2postgres.copying import MIN_ROWS, NotPlain, copy_in
from services.kafka2postgres.metrics import Metrics
from services.kafka2postgres.schema import ROW_ID, SchemaError, TableSchema
from services.kafka2postgres.settings import Kafka2PostgresSettings
from services.kafka2postgres.statements import (
    ROWS,
    TABLES,
    remove_in_ranges_sql,
    remove_older_sql,
)
from services.kafka2postgres.tables import Source, Tables, TargetTable, source_of
from shared.contract import keyranges
from shared.contract.event import EventDecodeError, EventView, checked_row_id
from shared.contract.moves import Moves, translate
from shared.errors import (
    PermanentError,
    RetriableError,
    TableStoppedError,
    Verdict,
    classify,
    operator_hint,
)
from shared.failpoints import failpoint
from shared.interfaces import BatchSink, Origin, Rejection, Wait
from shared.migrations import migrate

log = logging.getLogger(__name__)

COPY_PAUSE = 32
"""Batches of a table that go the guarded way without trying the bulk path after one
met a key the target holds (a re-snapshot of a full table would otherwise COPY each batch
twice)."""

SESSION = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=iso_8601"
"""The target session's settings the values are read under (the same as pg2kafka's
replication connection)."""


def connect(settings: Kafka2PostgresSettings) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.target.postgres.conninfo(options=SESSION), autocommit=True)


def _shown(exc: psycopg.Error) -> str:
    diag = exc.diag
    text = diag.message_primary or type(exc).__name__
    detail = f" ({diag.message_detail})" if diag.message_detail else ""
    return f"{diag.sqlstate or ''} {text}{detail}".strip()


class Applier(BatchSink[Batch]):
    """Applies batches to the target database (its contract: ordering, idempotency by
    version, what failure means — above)."""

    def __init__(
        self, settings: Kafka2PostgresSettings, metrics: Metrics, wait: Wait,
        connect_to: Callable[[], psycopg.Connection[Any]] | None = None,
    ) -> None:  # fmt: skip
        self.s = settings
        self.metrics = metrics
        self.wait = wait
        self._connect = connect_to or (lambda: connect(settings))
        self.tables = Tables(settings.target)
        self.lock = threading.Lock()  # one statement at a time on the connection
        self.conn: psycopg.Connection[Any] | None = None
        self.pruned_at = 0.0  # monotonic time of the last pruning of deleted rows' versions
        self.copy_paused: dict[int, int] = {}  # table id: batches left without the bulk path

    # -- the connection ------------------------------------------------------------------

    def session(self) -> psycopg.Connection[Any]:
        """The target connection, (re)opened with the bookkeeping migrated and loaded."""
        if self.conn is not None and not self.conn.closed and not self.conn.broken:
            return self.conn
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        conn = self._connect()
        try:
            applied = migrate(conn, "kafka2postgres")
            if applied:
                log.info("target bookkeeping migrated: %s", ", ".join(applied))
            self.tables.load(conn)
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.metrics.stopped.set(sum(1 for t in self.tables.by_source.values() if t.stopped))
        return conn

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def ping(self) -> tuple[bool, str]:
        with self.lock:
            self.session().execute("SELECT 1")
        return True, "target reachable"

    # -- the BatchSink side --------------------------------------------------------------

    def new_batch(self) -> Batch:
        return Batch()

    def add(self, batch: Batch, event: EventView, origin: Origin) -> str | None:
        source = source_of(event)
        t = self.tables.get(source)
        if event.append_only is True:
            try:
                checked_row_id(event)
            except EventDecodeError as exc:
                return f"a row of an insert-only table without its row id's parts: {exc}"
            if ROW_ID in event.column_types():
                return (
                    f"a row of an insert-only table with a column named {ROW_ID}: the name"
                    " kafka2postgres gives the row id it keys such a table's target by"
                )
            if t is not None and not t.schema.appended and not t.stopped:
                if event.version() <= t.schema_at:
                    # older than the key the table gained: the snapshot pg2kafka takes of
                    # a table that gains a key brings this row back, keyed
                    self.metrics.stale.inc()
                    return None
                return (
                    f"a row of an insert-only table whose target {t.shown} is keyed: the"
                    " source table lost its key (kafka2postgres writes such a table by key"
                    " only from then on: re-create the target table and re-snapshot it)"
                )
        if t is not None:
            if t.stopped:
                return f"table {t.shown} is stopped: {t.stopped}"
            if t.moves.items:
                event = translate(event, t.moves, t.schema.names)
        batch.add(source, event, origin)
        return None

    def write(
        self, batch: Batch, sleep: Wait, before: tuple[Future[list[Rejection]], ...] = ()
    ) -> list[Rejection]:
        """Apply ``batch`` in one transaction (on a writer thread). Returns the records
        refused for good (a table stopped); raises for anything else."""
        wait_futures(before)
        if any(f.exception() for f in before):
            raise RetriableError("an earlier write failed: its records are read again first")
        started = time.monotonic()
        rejected: list[Rejection] = []
        with self.lock:
            conn = self.session()
            try:
                with conn.transaction():
                    # tables claimed in one order: two writers never wait on each other
                    for source, tb in sorted(batch.tables.items()):
                        rejected += self._table(conn, source, tb)
                        failpoint("kafka2postgres.applied")  # in the transaction, uncommitted
                self._prune(conn)
            except BaseException:
                self._reload()
                raise
        self.metrics.write_seconds.observe(time.monotonic() - started)
        return rejected

    def control(self, event: EventView) -> None:
        source = source_of(event)
        with self.lock:
            conn = self.session()
            try:
                with conn.transaction():
                    self._control(conn, source, event)
            except TableStoppedError as exc:
                self._reload()
                self._stop(conn, source, str(exc), None)
            except psycopg.Error as exc:
                self._reload()
                if classify(exc) is not Verdict.PERMANENT:
                    raise
                self._stop(conn, source, self._reason(exc, f"{event.op} event"), None)
            except BaseException:
                self._reload()
                raise

    # -- one table of a batch --------------------------------------------------------------

    def _table(
        self, conn: psycopg.Connection[Any], source: Source, tb: TableBatch
    ) -> list[Rejection]:
        try:
            with conn.transaction():  # a savepoint: a refusal undoes this table only
                t = self.tables.claim(conn, source)
                if t is not None and t.stopped:  # stopped meanwhile, or still
                    reason = f"table {t.shown} is stopped: {t.stopped}"
                    return [(o, reason) for o in tb.origins]
                if t is None:
                    schema = TableSchema.from_types(tb.types, tb.key)
                    t = self.tables.ensure(conn, source, schema, -1)
                self.tables.widen(conn, t, tb.types)
                if self._copied(conn, t, tb):
                    return []
                counts = conn.execute(
                    t.apply_statement(),
                    {"rows": tb.elements().decode(), "floor": t.floor, "tbl": t.id},
                ).fetchone()
                if tb.fillers and counts is not None:
                    # older than the key's change just applied: they only fill columns
                    # the target holds no value for (batch.py)
                    more = conn.execute(
                        t.apply_statement(),
                        {"rows": tb.filler_elements().decode(), "floor": t.floor, "tbl": t.id},
                    ).fetchone()
                    if more is not None:
                        counts = (*counts[:5], int(counts[5]) + int(more[5]))
        except (TableStoppedError, SchemaError) as exc:
            self._reload_in(conn)
            reason = self._stop(conn, source, str(exc), tb)
            return [(o, reason) for o in tb.origins]
        except psycopg.Error as exc:
            if classify(exc) is not Verdict.PERMANENT:
                raise
            self._reload_in(conn)
            reason = self._stop(conn, source, self._reason(exc, "its rows"), tb)
            return [(o, reason) for o in tb.origins]
        assert counts is not None
        given, newer, deleted, updated, inserted, filled = (int(n) for n in counts[:6])
        log.debug(
            "%s: %d changes, %d above the floor, %d newer than held: %d inserted, %d updated,"
            " %d deleted, %d filled", t.shown, len(tb.changes), given, newer, inserted, updated,
            deleted, filled,
        )  # fmt: skip
        m = self.metrics.rows
        m.labels("insert").inc(inserted)
        m.labels("update").inc(updated)
        m.labels("delete").inc(deleted)
        m.labels("fill").inc(filled)
        self.metrics.stale.inc(given - newer)
        self.metrics.below_floor.inc(len(tb.changes) - given)
        return []

    def _copied(self, conn: psycopg.Connection[Any], t: TargetTable, tb: TableBatch) -> bool:
        """Whether the batch's rows of ``t`` went the bulk path (:mod:`.copying`): all new
        rows, none of whose keys the target holds. After a batch that met a held key, the
        table's next :data:`COPY_PAUSE` batches go the guarded way without trying."""
        changes = tb.changes.values()
        if len(changes) < MIN_ROWS or not all(c.new and c.unchanged is None for c in changes):
            return False
        paused = self.copy_paused.get(t.id, 0)
        if paused:
            self.copy_paused[t.id] = paused - 1
            return False
        p = t.copy_plan()
        if p is None:
            return False
        new = [c for c in changes if c.version > t.floor]
        try:
            with conn.transaction():  # a savepoint: a held key undoes only this attempt
                n = copy_in(conn, p, new, t.id) if new else 0
        except NotPlain:
            self.metrics.copy_batches.labels("converted").inc()
            return False
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
            # a held key; or a value or constraint the guarded way converts, or refuses
            # with the table's own error handling
            self.copy_paused[t.id] = COPY_PAUSE
            held = isinstance(exc, psycopg.errors.UniqueViolation)
            self.metrics.copy_batches.labels("held_key" if held else "refused").inc()
            log.debug("%s: the bulk path gave way to the guarded one: %s", t.shown, _shown(exc))
            return False
        self.metrics.copy_batches.labels("copied").inc()
        self.metrics.rows.labels("insert").inc(n)
        self.metrics.below_floor.inc(len(changes) - len(new))
        return True

    def _reason(self, exc: psycopg.Error, what: str) -> str:
        hint = operator_hint(exc)
        return f"the target refused {what}: {_shown(exc)}" + (f"; {hint}" if hint else "")

    def _stop(
        self, conn: psycopg.Connection[Any], source: Source, reason: str, tb: TableBatch | None
    ) -> str:
        """Record ``source``'s table as stopped (or stop the service, by setting)."""
        shown = f"{source[1]}.{source[2]}"
        if self.s.target.on_table_error == "stop_service":
            raise PermanentError(
                f"table {shown}: {reason}",
                hint="fix it, or set target.on_table_error=stop_table to let the other"
                " tables go on",
            )
        t = self.tables.get(source)
        if t is None:
            t = self._stopped_entry(conn, source, tb)
        with conn.transaction():
            self.tables.stop(conn, t, reason)
        self.metrics.stopped.set(sum(1 for x in self.tables.by_source.values() if x.stopped))
        return f"table {t.shown} is stopped: {reason}"

    def _stopped_entry(
        self, conn: psycopg.Connection[Any], source: Source, tb: TableBatch | None
    ) -> TargetTable:
        """A bookkeeping row for a table that could not be made, to hold its reason."""
        schema_name, name = self.tables.target_of(source)
        with conn.transaction():
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (source_db, source_schema, source_table, target_schema,"
                    " target_table, created_by_walcast) VALUES (%s, %s, %s, %s, %s, false)"
                    " ON CONFLICT (source_db, source_schema, source_table)"
                    " DO UPDATE SET target_table = excluded.target_table RETURNING id"
                ).format(TABLES),
                [*source, schema_name, name],
            ).fetchone()
        assert row is not None
        schema = TableSchema((), tuple(tb.key) if tb else (), False)
        t = TargetTable(
            row[0], source, schema_name, name, False, -1, -1, schema, Moves((), 0), None
        )
        self.tables.by_source[source] = t
        return t

    # -- table-wide events -----------------------------------------------------------------

    def _control(self, conn: psycopg.Connection[Any], source: Source, ev: EventView) -> None:
        if ev.op == "verify":
            return
        self.tables.claim(conn, source)
        if ev.op == "ddl":
            done = self.tables.ddl(conn, ev)
            self.metrics.schema_changes.inc()
            log.info("schema change of %s.%s at version %d: %s", source[1], source[2],
                     ev.version(), done)  # fmt: skip
            return
        if ev.op == "snapshot" and isinstance(ev.snapshot.get("columns"), list):
            log.info("snapshot %s of %s.%s starts with its schema: %s", ev.snapshot.get("id"),
                     source[1], source[2], self.tables.described(conn, ev))  # fmt: skip
        t = self.tables.get(source)
        if t is None or t.stopped:
            log.info("%s of %s.%s: no table written (yet), nothing to do", ev.op, source[1],
                     source[2])  # fmt: skip
            return
        version = ev.version()
        if ev.op == "truncate":
            self._remove_older(conn, t, version, version, "truncated")
            return
        phase = ev.snapshot.get("phase")
        if phase == "end":
            self._remove_older(conn, t, version, version - 1, "snapshot ended")
        elif phase == "range_end":
            self._range_end(conn, t, ev)
        else:
            log.info("snapshot %s of %s started (version %d)", ev.snapshot.get("id"), t.shown,
                     version)  # fmt: skip

    def _range_end(self, conn: psycopg.Connection[Any], t: TargetTable, ev: EventView) -> None:
        """The end of a snapshot of key ranges (``repair``: shared/contract/keyranges.py):
        as a snapshot's end, but only for the rows whose key lies in its ranges — every
        row the source holds there came at the marker's version or later, so a row held
        there below it is one the source no longer has. Nothing outside the ranges, no
        floor: applied again (a redelivery, a copy from another partition) it finds
        nothing more to remove."""
        version = ev.version()
        if version - 1 <= t.floor:
            return  # truncated (or snapshotted) after the run's start: nothing older left
        ranges = keyranges.parse(ev.snapshot.get("key_ranges"))  # checked with the event
        if sorted(ranges.columns) != sorted(t.schema.key):  # the ranges' order is the key's
            log.error("snapshot %s of key ranges of %s: its key %s is not the table's %s;"
                      " nothing removed", ev.snapshot.get("id"), t.shown, ranges.columns,
                      list(t.schema.key))  # fmt: skip
            return
        row = conn.execute(
            remove_in_ranges_sql(t.schema_name, t.name, t.schema, ranges),
            {"tbl": t.id, "version": version},
        ).fetchone()
        gone = row[0] if row else 0
        self.metrics.rows.labels("delete").inc(gone)
        log.info("snapshot %s of %d key range(s) of %s ended (version %d): %d rows older than"
                 " it in them removed", ev.snapshot.get("id"), len(ranges.ranges), t.shown,
                 version, gone)  # fmt: skip

    def _remove_older(
        self, conn: psycopg.Connection[Any], t: TargetTable, version: int, floor: int, what: str
    ) -> None:
        """Rows held below ``version`` go; changes at or below ``floor`` stay out from now
        on. A redelivered marker, or its copy from another partition, does nothing."""
        if floor <= t.floor:
            return
        row = conn.execute(
            remove_older_sql(t.schema_name, t.name, t.schema.key), {"tbl": t.id, "version": version}
        ).fetchone()
        t.floor = floor
        self.tables.save(conn, t)
        gone = row[0] if row else 0
        self.metrics.rows.labels("delete").inc(gone)
        log.info("%s %s at version %d: %d rows older than it removed", what, t.shown, version, gone)

    def _prune(self, conn: psycopg.Connection[Any]) -> None:
        """Forget deleted rows' versions older than ``target.tombstone_retention_s`` (at
        most every tenth of it, and every hour): past it, an older change of such a row —
        only a replay from further back brings one — could bring the row back."""
        retention = self.s.target.tombstone_retention_s
        now = time.monotonic()
        if now - self.pruned_at < min(retention / 10, 3600.0):
            return
        row = conn.execute(
            sql.SQL(
                "WITH gone AS (DELETE FROM {} WHERE deleted"
                " AND at < now() - make_interval(secs => %s) RETURNING 1)"
                " SELECT count(*) FROM gone"
            ).format(ROWS),
            [retention],
        ).fetchone()
        self.pruned_at = now
        if row and row[0]:
            log.info("forgot %d deleted rows' versions older than %g s", row[0], retention)

    # -- after a rollback ------------------------------------------------------------------

    def _reload(self) -> None:
        """The cached bookkeeping after a failed transaction: read again (or on the next
        connection)."""
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            self.conn = None
            return
        try:
            self.tables.load(conn)
        except psycopg.Error:
            conn.close()
            self.conn = None

    def _reload_in(self, conn: psycopg.Connection[Any]) -> None:
        """The cached bookkeeping after a savepoint rolled back, inside the transaction."""
        self.tables.load(conn)
