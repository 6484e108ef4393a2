"""What pg2kafka asks of Postgres besides the replication stream: catalog questions, the
leader lock, heartbeats, and waiting for a previous leader's walsender to go.

Each holds its own ordinary connection (never the replication connection), opened lazily
and closed by ``close`` / ``release``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg

from services.pg2kafka.replication import replication_application_name
from services.pg2kafka.settings import ReplicationSettings
from services.pg2kafka.types import TypeInfo
from shared.errors import PermanentError, RetriableError

log = logging.getLogger(__name__)


class Catalog:
    """Lazily-opened ordinary connection for the catalog questions the stream raises:
    unknown type OIDs (enums, domains, arrays) and primary keys of FULL-identity tables."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _conn(self) -> psycopg.Connection[tuple[object, ...]]:
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.conninfo, autocommit=True)
        return self.conn

    def type_info(self, oid: int) -> TypeInfo | None:
        row = (
            self._conn()
            .execute(
                "SELECT t.oid, t.typname, t.typtype, t.typbasetype,"
                " CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE 0 END, t.typdelim"
                " FROM pg_catalog.pg_type t WHERE t.oid = %s",
                [oid],
            )
            .fetchone()
        )
        if row is None:
            return None
        return TypeInfo(
            int(str(row[0])),
            str(row[1]),
            str(row[2]),
            int(str(row[3])),
            int(str(row[4])),
            str(row[5]),
        )

    def primary_key(self, relation_oid: int) -> list[str]:
        rows = (
            self._conn()
            .execute(
                "SELECT a.attname FROM pg_catalog.pg_index i"
                " JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid"
                " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary",
                [relation_oid],
            )
            .fetchall()
        )
        return [str(r[0]) for r in rows]

    def not_null(self, relation_oid: int) -> set[str]:
        """The columns of a table declared NOT NULL (Debezium's schemas mark them
        required)."""
        rows = (
            self._conn()
            .execute(
                "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = %s"
                " AND attnum > 0 AND NOT attisdropped AND attnotnull",
                [relation_oid],
            )
            .fetchall()
        )
        return {str(r[0]) for r in rows}

    def keyless_tables(self, publication: str) -> list[str]:
        """Tables the publication's filters match that are left out of it for want of a
        replica identity (``filters.keyless_tables: skip``, V008), as ``schema.table``;
        not those its insert-only publication streams (``inserts``, V017: read through
        ``to_jsonb`` so that a schema from before V017 is not an error)."""
        rows = (
            self._conn()
            .execute(
                "SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
                " AND c.relpersistence = 'p'"
                " AND n.nspname NOT IN ('pg_catalog', 'information_schema', '_walcast')"
                " AND n.nspname NOT LIKE 'pg\\_%%'"
                " AND _walcast.table_matches(%s, n.nspname, c.relname)"
                " AND NOT _walcast.has_identity(c.oid)"
                " AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel pr"
                "   JOIN pg_catalog.pg_publication pp ON pp.oid = pr.prpubid"
                "   JOIN _walcast.publications p"
                "     ON to_jsonb(p) ->> 'inserts_publication' = pp.pubname"
                "  WHERE p.publication = %s AND pr.prrelid = c.oid) ORDER BY 1",
                [publication, publication],
            )
            .fetchall()
        )
        return [str(r[0]) for r in rows]

    def wal_sender_timeout_s(self) -> float:
        row = (
            self._conn()
            .execute(
                "SELECT setting::float / 1000 FROM pg_catalog.pg_settings"
                " WHERE name = 'wal_sender_timeout'"
            )
            .fetchone()
        )
        return float(str(row[0])) if row else 60.0

    def slot_holder(self, slot: str) -> tuple[int, str] | None:
        """(pid, application_name) of the process streaming ``slot``, if any."""
        row = (
            self._conn()
            .execute(
                "SELECT s.active_pid, coalesce(a.application_name, '')"
                " FROM pg_catalog.pg_replication_slots s"
                " LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid"
                " WHERE s.slot_name = %s AND s.active",
                [slot],
            )
            .fetchone()
        )
        return None if row is None else (int(str(row[0])), str(row[1]))

    def snapshot_position(self) -> tuple[str, int]:
        """A snapshot and a WAL insert position read after it: every transaction visible in
        the snapshot wrote its commit record before that position."""
        conn = self._conn()
        snap = conn.execute("SELECT pg_catalog.pg_current_snapshot()::text").fetchone()
        lsn = conn.execute(
            "SELECT pg_catalog.pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
        ).fetchone()
        assert snap is not None
        assert lsn is not None
        return str(snap[0]), int(str(lsn[0]))

    def execute(self, statement: str, params: list[object]) -> None:
        self._conn().execute(statement, params)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# The server's WAL position (a hot standby's: what it replayed) minus the slot's
# restart_lsn. Always one row, NULL when the slot is not there.
RETAINED_WAL_SQL = """
SELECT pg_wal_lsn_diff(
         CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
         (SELECT restart_lsn FROM pg_replication_slots WHERE slot_name = %s))::bigint
"""


class LeaderLock:
    """Session-level advisory lock naming the slot: whoever holds it streams.

    Held on its own ordinary connection for as long as the process streams; Postgres
    releases it the moment that connection dies, so a standby takes over within one
    ``poll_s`` of the leader's death. Postgres itself still refuses a second walsender on
    the slot, so the lock only makes the hand-over quick and quiet, never unsafe.
    """

    def __init__(self, conninfo: str, slot: str) -> None:
        self.conninfo = conninfo
        self.slot = slot
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._checked = time.monotonic()
        # The WAL the server keeps for the slot (its current position minus the slot's
        # restart_lsn), as of the last ``check``: what a stalled pipeline costs the
        # server's disk. None until read, or when the slot is not there.
        self.retained_wal_bytes: int | None = None

    def acquire(
        self,
        stop: threading.Event,
        poll_s: float,
        tick: Callable[[], None] = lambda: None,
        standing_by: Callable[[], None] = lambda: None,
    ) -> bool:
        """Block until leader (True) or stopped (False); ``tick`` runs every round, so
        liveness checks see a waiting standby as alive; ``standing_by`` after every round
        that found another process leading (this one is a healthy standby: connected,
        ready to take over)."""
        announced = False
        while not stop.is_set():
            tick()
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(
                    self.conninfo, autocommit=True, application_name=f"pg2kafka-lock:{self.slot}"
                )
            row = self.conn.execute(
                "SELECT pg_try_advisory_lock(hashtext('walcast.pg2kafka'), hashtext(%s))",
                [self.slot],
            ).fetchone()
            if row and row[0]:
                log.info("leader for slot %s", self.slot)
                return True
            standing_by()
            if not announced:
                log.info("standby: another pg2kafka streams slot %s", self.slot)
                announced = True
            stop.wait(poll_s)
        return False

    def check(self, every_s: float) -> None:
        """While streaming: make sure the lock's session is still there. If it died, a
        standby may lead by now, so stop and start over as a candidate. The same round
        trip reads the slot's retained WAL (``retained_wal_bytes``)."""
        now = time.monotonic()
        if now - self._checked < every_s:
            return
        self._checked = now
        try:
            if self.conn is None or self.conn.closed:
                raise psycopg.OperationalError("lock connection closed")
            row = self.conn.execute(RETAINED_WAL_SQL, [self.slot]).fetchone()
        except psycopg.Error as exc:
            raise RetriableError(f"lost the leader lock's session: {exc}") from exc
        self._retained(row)

    def read_retained(self, every_s: float) -> None:
        """``retained_wal_bytes`` again, at most every ``every_s``, where no session runs
        ``check`` (the initial snapshot): a failure only leaves the value unknown."""
        now = time.monotonic()
        if now - self._checked < every_s or self.conn is None or self.conn.closed:
            return
        self._checked = now
        try:
            self._retained(self.conn.execute(RETAINED_WAL_SQL, [self.slot]).fetchone())
        except psycopg.Error as exc:
            log.debug("reading the slot's retained WAL failed: %s", exc)
            self.retained_wal_bytes = None

    def _retained(self, row: tuple[object, ...] | None) -> None:
        # NULL: no slot by that name, or an invalidated one (restart_lsn NULL)
        self.retained_wal_bytes = None if row is None or row[0] is None else int(str(row[0]))

    def release(self) -> None:
        if self.conn is not None:
            self.conn.close()  # closing the session releases the lock
            self.conn = None


class Heartbeat:
    """Writes a non-transactional logical message into this database's WAL every
    ``interval_s`` while the pipeline is idle. The walsender streams it like any change,
    so the confirmed LSN moves past WAL that held nothing for us and the slot never pins
    it (an idle or fully filtered database). Not forwarded to Kafka."""

    PREFIX = "walcast.heartbeat"

    def __init__(self, catalog: Catalog, interval_s: float) -> None:
        self.catalog = catalog
        self.interval_s = interval_s
        self.last = time.monotonic()

    def maybe_beat(self) -> None:
        if self.interval_s <= 0 or time.monotonic() - self.last < self.interval_s:
            return
        self.last = time.monotonic()
        try:
            self.catalog.execute(
                "SELECT pg_logical_emit_message(false, %s, now()::text)", [self.PREFIX]
            )
        except psycopg.errors.InsufficientPrivilege as exc:
            # Keepalive positions still advance the slot; heartbeats only make it steadier.
            log.warning(
                "heartbeats disabled: %s (GRANT EXECUTE ON FUNCTION"
                " pg_logical_emit_message(boolean, text, text) TO this role)",
                exc,
            )
            self.interval_s = 0


def wait_for_slot(
    catalog: Catalog,
    slot: str,
    rep: ReplicationSettings,
    stop: threading.Event,
    tick: Callable[[], None],
) -> None:
    """As leader, give a previous leader's walsender ``slot_busy_grace_s`` to go; a slot
    still streamed by someone else after that belongs to another consumer."""
    # A walsender whose client vanished lingers up to wal_sender_timeout.
    timeout = rep.wal_sender_timeout_s or catalog.wal_sender_timeout_s()
    grace = max(rep.slot_busy_grace_s, timeout + 5)
    deadline = time.monotonic() + grace
    while True:
        holder = catalog.slot_holder(slot)
        if holder is None:
            return
        if time.monotonic() >= deadline:
            pid, app_name = holder
            if app_name == replication_application_name(slot):
                # Another pg2kafka (a leader whose lock connection died): not ours to judge
                # as misconfiguration; back off and try again.
                raise RetriableError(f"slot still streamed by pg2kafka pid {pid}")
            raise PermanentError(
                f"replication slot {slot!r} is streamed by"
                f" another process (pid {pid}, application_name {app_name!r})",
                hint="stop that consumer, or give pg2kafka its own replication.slot",
            )
        tick()
        stop.wait(0.5)
        if stop.is_set():
            return
