"""Which logical messages in the WAL are walcast's own.

pgoutput passes on every logical message of the database, and does not say who wrote it;
``pg_logical_emit_message`` is executable by PUBLIC unless a superuser revoked it. pg2kafka
acts on two kinds of message — DDL capture (``walcast.ddl``) and incremental-snapshot
watermarks (``walcast.snapshot``) — so it acts only on those signed with the database's
message key (migration V013: ``_walcast.message_key``, readable by the owner only, written
by ``_walcast.emit_message``, the owner's alone). Any other message with one of those
prefixes is ignored, counted and logged: it never changes what reaches Kafka.

The signed form, decided here and in the migration that defines
``_walcast.emit_message`` (V018) only::

    'walcast-sig-v2:' || hex(sha256(key || sha256(prefix || ':' || xid || ':' || body)))
        || ':' || body

``xid`` is the writing transaction's 32-bit id, in decimal: the message is valid only in
the transaction that wrote it, so bytes copied from the WAL by a role that may read it
and emitted again in another transaction are refused (as is a message moved to another
prefix). The first form (V013, without prefix and xid) is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any

import psycopg

from services.pg2kafka import pgoutput as pg
from shared.errors import PermanentError
from shared.logs import SampledLog

log = logging.getLogger(__name__)

SIGNED = b"walcast-sig-v2:"
SIGNED_SINCE = 18  # the migration that writes this form
_DIGEST_HEX = 64


def _digest(key: bytes, prefix: str, xid: int, body: bytes) -> bytes:
    inner = hashlib.sha256(f"{prefix}:{xid}:".encode() + body).digest()
    return hashlib.sha256(key + inner).hexdigest().encode()


def sign(key: bytes, prefix: str, xid: int, body: bytes) -> bytes:
    """The signed content of ``body`` (what ``_walcast.emit_message`` writes in
    transaction ``xid``); for tests and tools — pg2kafka writes through the SQL function."""
    return SIGNED + _digest(key, prefix, xid, body) + b":" + body


class MessageKey:
    """The database's message key, or none (the database has no walcast objects, so
    nothing of walcast's writes messages there: every message is ignored).

    :meth:`open` is called for every message with a walcast prefix, on the stream's
    thread; it never raises.
    """

    def __init__(self, key: bytes | None) -> None:
        self._key = key
        self.rejected = 0  # read and reset by the session (a metric)
        self._log = SampledLog(log, "unauthenticated logical messages")

    @classmethod
    def load(cls, conn: psycopg.Connection[Any]) -> MessageKey:
        """Read the key as the owner. A database whose walcast objects predate the
        signed form (V018) is refused: its triggers would write messages pg2kafka ignores.
        Without a key — a database without walcast's objects (nothing of walcast writes
        there), or a role that may not read them (said in the log) — every message with a
        walcast prefix is ignored: fail-safe, as no DDL capture."""
        try:
            row = conn.execute(
                "SELECT pg_catalog.to_regclass('_walcast.schema_migrations') IS NOT NULL"
            ).fetchone()
            if not (row and row[0]):
                return cls(None)
            row = conn.execute(
                "SELECT coalesce(max(version), 0) FROM _walcast.schema_migrations"
                " WHERE component = 'pg2kafka'"
            ).fetchone()
            if row is None or int(row[0]) < SIGNED_SINCE:
                raise PermanentError(
                    "this database's walcast objects are older than this pg2kafka (migration"
                    f" V{SIGNED_SINCE:03d}, logical messages signed per transaction, is"
                    " missing)",
                    hint="run `pg2kafka init` once with this version: it applies the missing"
                    " migrations",
                )
            key = conn.execute("SELECT key FROM _walcast.message_key").fetchone()
        except psycopg.errors.InsufficientPrivilege:
            log.warning(
                "pg2kafka's role may not read walcast's message key (_walcast.message_key):"
                " DDL events and incremental-snapshot watermarks are ignored. Run pg2kafka as"
                " the role that ran `pg2kafka init` (the owner of schema _walcast)"
            )
            return cls(None)
        return cls(bytes(key[0]) if key else None)

    def open(self, msg: pg.Message, lsn: int, xid: int | None) -> bytes | None:
        """The body of a message walcast signed in transaction ``xid`` (the one it arrives
        in; None: outside a transaction, never walcast's); None (counted, logged) for any
        other."""
        content = msg.content
        if self._key is not None and xid is not None and content.startswith(SIGNED):
            digest = content[len(SIGNED) : len(SIGNED) + _DIGEST_HEX]
            body = content[len(SIGNED) + _DIGEST_HEX + 1 :]
            if content[len(SIGNED) + _DIGEST_HEX : len(SIGNED) + _DIGEST_HEX + 1] == b":":
                want = _digest(self._key, msg.prefix, xid, body)
                if hmac.compare_digest(digest, want):
                    return body
        self.rejected += 1
        self._log.warning(
            msg.prefix,
            "ignoring a %r logical message at %s that walcast did not write (no valid"
            " signature): some role called pg_logical_emit_message with walcast's prefix;"
            " revoke EXECUTE on it from PUBLIC (docs/security.md)",
            msg.prefix,
            pg.format_lsn(lsn),
        )
        return None


__all__ = ["SIGNED", "MessageKey", "sign"]
