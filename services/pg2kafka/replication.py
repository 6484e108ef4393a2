"""Streaming a logical replication slot with psycopg 3's libpq layer (COPY_BOTH).

psycopg 3 has no replication API, but its ``pq`` module exposes libpq's copy functions,
which is all the streaming protocol needs: ``START_REPLICATION`` puts the connection in
COPY_BOTH mode; the server sends XLogData ('w') and keepalive ('k') messages; we send
standby status updates ('r'). One driver for the whole project (see docs/decisions.md).

Contract of :class:`PostgresReplicationSource`:

* ``poll`` returns the next (LSN, decoded message) in stream order, or None after
  ``timeout_s`` without data. Keepalives are absorbed: they update ``server_wal_end``
  and, when the server asks for a reply, trigger an immediate status update.
* ``confirm(lsn)`` records the position that may be reported as flushed; the next status
  update (every ``status_interval_s``, or on request) sends it. Postgres then may
  recycle WAL before it and will not resend transactions that ended before it.
* A failure raises; psycopg errors keep their SQLSTATE so :func:`shared.errors.classify`
  can tell a dropped connection (retry) from a missing privilege (stop).
"""

from __future__ import annotations

import logging
import select
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import psycopg
from psycopg import pq

from services.pg2kafka import pgoutput
from services.pg2kafka.pgoutput import format_lsn
from shared.contract.rowhash import TEXT_OUTPUT_OPTIONS
from shared.errors import PermanentError, RetriableError
from shared.formats import debezium
from shared.interfaces import Source
from shared.settings import SAFE_SEARCH_PATH

log = logging.getLogger(__name__)

_XLOG_HEADER = struct.Struct("!QQq")  # wal start, wal end, send time
_KEEPALIVE = struct.Struct("!QqB")  # wal end, send time, reply requested
_STATUS = struct.Struct("!cQQQqB")

# The Debezium format reads money as an amount (shared/formats/debezium.py).
DEBEZIUM_SESSION_OPTIONS = debezium.SESSION_OPTIONS

# Pin the text output of every type, so the converters in types.py see one format and
# the row hash is the one Postgres computes in a verify session (the same settings).
SESSION_OPTIONS = f"{SAFE_SEARCH_PATH} {TEXT_OUTPUT_OPTIONS}"


def replication_application_name(slot: str) -> str:
    """How pg2kafka's replication connection names itself in pg_stat_activity."""
    return f"pg2kafka:{slot}"


def _pg_now_us() -> int:
    return int(time.time() * 1_000_000) - pgoutput.PG_EPOCH_OFFSET_US


class PostgresReplicationSource(Source[pgoutput.Decoded, int]):
    """One replication connection streaming ``slot`` with pgoutput v1."""

    def __init__(
        self,
        conninfo: str,
        slot: str,
        publication: str,
        *,
        status_interval_s: float = 5.0,
        wal_sender_timeout_s: float | None = None,
        invalid_text: str = "database",
        extra_options: str = "",
        optional_publications: tuple[str, ...] = (),
    ) -> None:
        self.conninfo = conninfo
        self.invalid_text = invalid_text
        self.slot = slot
        self.publication = publication
        # Streamed with ``publication`` when they exist at start (the insert-only one of
        # filters.keyless_tables=inserts: an install init has not created it on streams
        # the main one alone). Checked at every start: a reconnect picks up a new one.
        self.optional_publications = optional_publications
        self.publications = publication
        self.status_interval_s = status_interval_s
        self.options = SESSION_OPTIONS + (" " + extra_options if extra_options else "")
        if wal_sender_timeout_s is not None:
            self.options += f" -c wal_sender_timeout={int(wal_sender_timeout_s * 1000)}"
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.received_lsn = 0
        self.confirmed_lsn = 0
        self.server_wal_end = 0
        # sentPtr from the last keepalive: everything committed before it has been sent.
        self.keepalive_lsn = 0
        self._last_status = 0.0
        self._reply_now = False

    def start(self) -> None:
        """Connect and START_REPLICATION from the slot's confirmed position."""
        self.conn = psycopg.connect(
            self.conninfo,
            replication="database",
            autocommit=True,
            options=self.options,
            application_name=replication_application_name(self.slot),
        )
        pgconn = self.conn.pgconn
        encoding = pgconn.parameter_status(b"server_encoding")
        if encoding == b"SQL_ASCII":
            # pgoutput converts values to the client encoding: from SQL_ASCII (bytes with
            # no encoding) that fails on the first byte that is not UTF-8, inside the
            # server, for good. Take the bytes as they are and decode them here.
            self.conn.execute("SET client_encoding = 'SQL_ASCII'")
        if encoding is not None and encoding != b"UTF8":
            pgoutput.TEXT.configure(encoding.decode(), self.invalid_text)
            log.info("database encoding %s: text that is not UTF-8 is decoded by policy"
                     " %r", encoding.decode(), self.invalid_text)  # fmt: skip
        self.publications = ",".join([self.publication, *self._existing_optional()])
        # Starting at 0/0 means "from the slot's confirmed_flush_lsn". publication_names
        # is a comma-separated list (the names are plain: settings.plain_name).
        command = (
            f'START_REPLICATION SLOT "{self.slot}" LOGICAL 0/0 '
            f"(\"proto_version\" '1', \"publication_names\" '{_quote_literal(self.publications)}',"
            " \"messages\" 'true')"
        )
        pgconn.send_query(command.encode())
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise _start_error(result, self.slot)
        # Drain the (absent) trailing result is not needed in COPY_BOTH; go non-blocking.
        pgconn.nonblocking = 1
        self._last_status = time.monotonic()
        log.info("streaming slot", extra={"slot": self.slot, "publication": self.publications})

    def _existing_optional(self) -> list[str]:
        """Which of :attr:`optional_publications` exist, asked on the replication
        connection (simple protocol: no parameters; the names are plain identifiers)."""
        if not self.optional_publications:
            return []
        assert self.conn is not None
        names = ", ".join(f"'{_quote_literal(n)}'" for n in self.optional_publications)
        rows = self.conn.execute(
            f"SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ({names})"
        ).fetchall()
        found = {str(r[0]) for r in rows}
        return [n for n in self.optional_publications if n in found]

    def poll(self, timeout_s: float) -> tuple[int, pgoutput.Decoded] | None:
        pgconn = self._pgconn()
        deadline = time.monotonic() + timeout_s
        while True:
            nbytes, data = pgconn.get_copy_data(1)
            if nbytes == 0:
                self.maybe_send_status()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                ready, _, _ = select.select([pgconn.socket], [], [], min(remaining, 1.0))
                if ready:
                    pgconn.consume_input()
                continue
            if nbytes == -1:
                raise _stream_end(pgconn, self.slot)
            if nbytes == -2:
                raise RetriableError(
                    f"replication stream failed: {pgconn.error_message.decode(errors='replace')}"
                )
            buf = bytes(data)
            kind = buf[:1]
            if kind == b"w":
                wal_start, wal_end, _ = _XLOG_HEADER.unpack_from(buf, 1)
                self.received_lsn = max(self.received_lsn, wal_start)
                self.server_wal_end = max(self.server_wal_end, wal_end)
                return wal_start, pgoutput.decode_at(buf, 1 + _XLOG_HEADER.size)
            if kind == b"k":
                wal_end, _, reply = _KEEPALIVE.unpack_from(buf, 1)
                self.server_wal_end = max(self.server_wal_end, wal_end)
                self.keepalive_lsn = max(self.keepalive_lsn, wal_end)
                if reply:
                    self._reply_now = True
                self.maybe_send_status()
                continue
            log.warning("ignoring unknown replication message %r", kind)

    def poll_batch(self, max_messages: int, timeout_s: float) -> list[tuple[int, pgoutput.Decoded]]:
        """Up to ``max_messages`` already-received messages; waits up to ``timeout_s``
        only for the first one. Batching keeps the per-message cost to decoding."""
        first = self.poll(timeout_s)
        if first is None:
            return []
        out = [first]
        while len(out) < max_messages:
            nxt = self.poll(0)
            if nxt is None:
                break
            out.append(nxt)
        return out

    def confirm(self, lsn: int) -> None:
        if lsn > self.confirmed_lsn:
            self.confirmed_lsn = lsn

    def maybe_send_status(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or self._reply_now or now - self._last_status >= self.status_interval_s:
            self.send_status()

    def send_status(self) -> None:
        """Report write = received, flush = apply = confirmed (checkpoint last)."""
        pgconn = self._pgconn()
        flushed = self.confirmed_lsn
        written = max(self.received_lsn, flushed)
        msg = _STATUS.pack(b"r", written, flushed, flushed, _pg_now_us(), 0)
        if pgconn.put_copy_data(msg) != 1:
            raise RetriableError("could not queue standby status update")
        while pgconn.flush() == 1:
            select.select([], [pgconn.socket], [], 1.0)
        self._last_status = time.monotonic()
        self._reply_now = False

    def close(self) -> None:
        if self.conn is not None:
            try:
                if self.conn.pgconn.status == pq.ConnStatus.OK:
                    self.send_status()
            except Exception as exc:  # noqa: BLE001 - best effort on the way out
                log.debug("final status update failed: %s", exc)
            self.conn.close()
            self.conn = None

    def _pgconn(self) -> pq.abc.PGconn:
        if self.conn is None:
            raise RuntimeError("replication source not started")
        return self.conn.pgconn


@contextmanager
def created_slot_snapshot(conninfo: str, slot: str) -> Iterator[tuple[str, str]]:
    """Create logical slot ``slot`` (pgoutput) and yield (consistent point, exported
    snapshot name). While the block runs the snapshot can be imported with ``SET
    TRANSACTION SNAPSHOT``: a transaction visible in it is never streamed by the new slot,
    one not visible in it always is, so the two together see every commit exactly once."""
    with psycopg.connect(
        conninfo,
        replication="database",
        autocommit=True,
        application_name=replication_application_name(slot),
    ) as conn:
        result = conn.pgconn.exec_(
            f"CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput (SNAPSHOT 'export')".encode()
        )
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise RetriableError(f"could not create replication slot {slot!r}: {message}")
        consistent_point = (result.get_value(0, 1) or b"").decode()
        snapshot = (result.get_value(0, 2) or b"").decode()
        yield consistent_point, snapshot


class Identity(NamedTuple):
    """What ``IDENTIFY_SYSTEM`` says of a server: which cluster (``system``), which
    history (``timeline``) and how far its WAL is flushed (``wal_lsn``). A restored or
    promoted server answers differently (services/pg2kafka/source.py)."""

    system: str
    timeline: int
    wal_lsn: int


def identify_system(conninfo: str) -> Identity:
    """The server's :class:`Identity`."""
    with psycopg.connect(conninfo, replication="database", autocommit=True) as conn:
        result = conn.pgconn.exec_(b"IDENTIFY_SYSTEM")
        if result.status != pq.ExecStatus.TUPLES_OK:
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise RetriableError(f"IDENTIFY_SYSTEM failed: {message}")
        return Identity(
            (result.get_value(0, 0) or b"").decode(),
            int(result.get_value(0, 1) or b"0"),
            pgoutput.parse_lsn((result.get_value(0, 2) or b"0/0").decode()),
        )


class SlotInvalidatedError(PermanentError):
    """The slot was invalidated (``max_slot_wal_keep_size``): the WAL after its position is
    gone. Permanent for the CDC stream; the subscription stream recovers from its table."""


def _quote_literal(value: str) -> str:
    return value.replace("'", "''")


def _start_error(result: pq.abc.PGresult | None, slot: str) -> Exception:
    if result is None:
        return RetriableError("START_REPLICATION returned no result")
    message = (result.error_message or b"").decode(errors="replace").strip()
    sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    if sqlstate == "42704":
        return PermanentError(
            f"replication slot {slot!r} does not exist", hint="run `pg2kafka init` first"
        )
    if sqlstate == "55006":
        return RetriableError(f"replication slot {slot!r} is in use by another process: {message}")
    if sqlstate == "42501" or sqlstate.startswith("28"):
        return PermanentError(
            f"not allowed to stream: {message}",
            hint="grant the role REPLICATION (ALTER ROLE ... REPLICATION)",
        )
    detail = (result.error_field(pq.DiagnosticField.MESSAGE_DETAIL) or b"").decode()
    if sqlstate == "55000" and any(
        marker in text
        for text in (message, detail)
        for marker in ("invalidated", "can no longer get changes")
    ):
        return SlotInvalidatedError(
            message if detail in message else f"{message} {detail}",
            hint="the slot was invalidated (max_slot_wal_keep_size): changes after its last"
            " position are gone from the WAL; recreate it (pg2kafka tear-down, init) and"
            " resynchronise the consumers",
        )
    if sqlstate == "55000":
        return PermanentError(message, hint="set wal_level = logical and restart Postgres")
    return RetriableError(f"START_REPLICATION failed ({sqlstate}): {message}")


def _stream_end(pgconn: pq.abc.PGconn, slot: str) -> Exception:
    """The server ended the stream: classify by SQLSTATE like a failed start."""
    result = pgconn.get_result()
    if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
        sqlstate = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
        if sqlstate and sqlstate[:2] not in ("08", "57", "53", "58", "40"):
            return _start_error(result, slot)
        msg = (result.error_message or b"").decode(errors="replace").strip()
        return RetriableError(f"replication stream ended by the server: {msg}")
    return RetriableError("replication stream ended by the server")


__all__ = [
    "Identity",
    "PostgresReplicationSource",
    "SlotInvalidatedError",
    "created_slot_snapshot",
    "format_lsn",
    "identify_system",
]
