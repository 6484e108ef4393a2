"""From decoded pgoutput messages to change events, and from Kafka acks to a safe LSN.

:class:`EventBuilder` keeps the per-stream state the protocol relies on (the relation
cache, the open transaction) and turns each data message into a v1 change event (see
:mod:`shared.contract.event`). :class:`AckTracker` decides which LSN may be confirmed to the slot:
only the end of a transaction whose every message Kafka has acknowledged, and only once
every earlier transaction is acknowledged too (checkpoint last).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson

from services.pg2kafka import pgoutput as pg
from services.pg2kafka._native import RowEncoder, RowHasher
from services.pg2kafka.ddl_secrets import scrub_statement
from services.pg2kafka.transforms import WITHHELD, Transforms, unique_key
from services.pg2kafka.types import TypeRegistry
from shared.contract.event import EVENT_VERSION, MAX_MARK_ID, SnapshotInfo
from shared.contract.event import ChangeEvent as Event
from shared.errors import PermanentError
from shared.logs import SampledLog

log = logging.getLogger(__name__)


def iso_utc(unix_us: int) -> str:
    dt = datetime.fromtimestamp(unix_us / 1_000_000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ddl_shape(payload: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The tables of a DDL message, or ValueError when it is not what the triggers write."""
    if not isinstance(payload, dict):
        raise ValueError("not an object")
    tables = payload.get("tables", [])
    dropped = payload.get("dropped", [])
    if not isinstance(tables, list) or not isinstance(dropped, list):
        raise ValueError("tables / dropped are not lists")
    for t in tables:
        if not (
            isinstance(t, dict)
            and isinstance(t.get("schema"), str)
            and isinstance(t.get("table"), str)
            and isinstance(t.get("columns"), list)
            and isinstance(t.get("primary_key"), list)
        ):
            raise ValueError(f"bad table entry {t!r:.200}")
    for t in dropped:
        if not (
            isinstance(t, dict)
            and isinstance(t.get("schema"), str)
            and isinstance(t.get("table"), str)
        ):
            raise ValueError(f"bad dropped entry {t!r:.200}")
    return tables, dropped


@dataclass(frozen=True, slots=True)
class _RelInfo:
    encoder: RowEncoder
    # The row hash over the stream's columns, before any transform rule: it describes the
    # source row (shared/contract/rowhash.py).
    hasher: RowHasher
    columns: int  # the relation's, before any transform rule drops some
    has_key: bool
    types: orjson.Fragment  # the event's "types", encoded once
    # No replica identity at all ('n', or 'd' / 'i' without a key column): only its
    # inserts can be published (filters.keyless_tables=inserts), whose events and read
    # rows carry "append_only" (shared/contract/event.py).
    append_only: bool
    # The transform rules' rewrite of a row's values (services/pg2kafka/transforms.py);
    # None when no rule touches the relation.
    apply: Callable[[tuple[pg.Value, ...]], tuple[pg.Value, ...]] | None = None


def append_only(rel: pg.Relation) -> bool:
    """Whether the relation's rows are an insert-only table's (``append_only``): no
    replica identity column — REPLICA IDENTITY NOTHING, or DEFAULT / USING INDEX without
    a key. Postgres publishes only the inserts (and truncates) of such a table, so its
    rows have no identity but their position. FULL identity flags every column as key."""
    return rel.replica_identity != "f" and not any(c.is_key for c in rel.columns)


def set_epoch(ev: Event, epoch: int) -> None:
    """Put the source's epoch on an event (when above 0) in the contract's field order:
    ``epoch`` before ``append_only``, so a redelivery encodes byte-identical."""
    if not epoch:
        return
    flag = ev.pop("append_only", None)
    ev["epoch"] = epoch
    if flag is not None:
        ev["append_only"] = flag


# (row JSON, key JSON, unchanged-TOAST columns or None, row hash or None)
Row = tuple[bytes, bytes, list[str] | None, int | None]
"""One row as the event carries it: its JSON, its key's JSON (``{}`` when the relation has
no key columns), ready to embed, and the unchanged-TOAST columns left out (or None). A
plain tuple: one is built per row."""


@dataclass
class Transaction:
    xid: int
    commit_lsn: int
    commit_ts: str
    seq: int
    events: int = 0  # events built so far: the next event's "seq"
    commit_us: int = 0  # the commit time, microseconds since the Unix epoch


class EventBuilder:
    """Stateful: feed every decoded message in stream order, collect the events.

    ``no_identity``: what to do with a change to a table that has no replica identity
    columns (no primary key, REPLICA IDENTITY NOTHING or DEFAULT without a key):
    ``emit`` (the event carries the row and an empty ``key``) or ``skip`` (counted by the
    caller through ``skipped_no_identity``).

    ``scrub_secrets``: DDL events carry their statement with the literals of PASSWORD
    clauses and secret options replaced (:func:`~services.pg2kafka.ddl_secrets.scrub_statement`).

    ``transforms``: column rules applied to every row (new, old, key, snapshot rows) and
    to DDL events' column lists; a relation a rule may not apply to (a non-hash rule on a
    key column) raises PermanentError when its first row or DDL event is built, and so
    does a Relation message or DDL event that shows a covered column renamed or moved
    out from under its rule (services/pg2kafka/transform_shapes.py), before anything of
    it is sent. With rules, DDL events carry no statement text (``WITHHELD``).
    """

    def __init__(
        self,
        database: str,
        types: TypeRegistry,
        *,
        no_identity: str = "emit",
        primary_key: Callable[[int], list[str]] | None = None,
        scrub_secrets: bool = True,
        transforms: Transforms | None = None,
    ) -> None:
        self.database = database
        self.transforms = transforms
        self._session = transforms.shapes.session() if transforms is not None else 0
        self.scrub_secrets = scrub_secrets
        self.primary_key = primary_key
        self.types = types
        self.no_identity = no_identity
        self.relations: dict[int, pg.Relation] = {}
        self.txn: Transaction | None = None
        self._info: dict[int, _RelInfo] = {}
        self._warned: set[int] = set()
        self.malformed_ddl = 0
        self.unconverted = 0  # values kept as text because their converter failed
        self._kept_log = SampledLog(log, "values kept as text")
        self._seq = 0
        self.skipped_no_identity = 0

    def begin(self, msg: pg.Begin) -> Transaction:
        self._seq += 1
        self.txn = Transaction(
            msg.xid, msg.final_lsn, iso_utc(msg.commit_ts_us), self._seq,
            commit_us=msg.commit_ts_us,
        )  # fmt: skip
        return self.txn

    def commit(self, msg: pg.Commit) -> Transaction:
        txn = self.txn
        if txn is None:
            raise PermanentError("pgoutput protocol: Commit without Begin")
        self.txn = None
        return txn

    def relation(self, msg: pg.Relation) -> None:
        """Cache the relation. Under REPLICA IDENTITY FULL the server flags every column
        as key; the event's ``key`` should still be the primary key where there is one.
        PermanentError (nothing cached) when the transform rules no longer cover a column
        they covered in the relation's last shape: it comes before the relation's rows."""
        if self.transforms is not None:
            self.transforms.shapes.check(
                msg.oid, msg.schema, msg.table, [c.name for c in msg.columns],
                session=self._session,
                lsn=self.txn.commit_lsn if self.txn is not None else None,
                where="the stream's Relation message",
            )  # fmt: skip
        if msg.replica_identity == "f" and self.primary_key is not None:
            pk = set(self.primary_key(msg.oid))
            if pk:
                cols = tuple(replace(c, is_key=c.name in pk) for c in msg.columns)
                msg = replace(msg, columns=cols)
        self.relations[msg.oid] = msg
        self._info.pop(msg.oid, None)

    def _rel_info(self, rel: pg.Relation) -> _RelInfo:
        """Per-relation facts computed once, not per row: the row encoder (names,
        conversions, key columns) and the types."""
        info = self._info.get(rel.oid)
        if info is None:
            plan = None
            if self.transforms is not None:
                plan = self.transforms.plan(rel, unique_key(rel, self.primary_key))
            cols = plan.relation.columns if plan is not None else rel.columns
            info = _RelInfo(
                encoder=RowEncoder(
                    [c.name for c in cols],
                    [self.types.spec(c.type_oid) for c in cols],
                    [c.is_key for c in cols],
                ),
                hasher=RowHasher([c.name for c in rel.columns]),
                columns=len(rel.columns),
                has_key=any(c.is_key for c in cols),
                append_only=append_only(rel),
                types=orjson.Fragment(
                    orjson.dumps({c.name: self.types.name(c.type_oid) for c in cols})
                ),
                apply=plan.apply if plan is not None else None,
            )
            self._info[rel.oid] = info
        return info

    def type_message(self, msg: pg.TypeMessage) -> None:
        self.types.named(msg.oid, msg.name)
        self._info.clear()

    def _rel(self, oid: int) -> pg.Relation:
        rel = self.relations.get(oid)
        if rel is None:
            raise PermanentError(
                f"pgoutput protocol: change for relation {oid} before its Relation message"
            )
        return rel

    def _row(self, rel: pg.Relation, values: tuple[pg.Value, ...], hashed: bool = False) -> Row:
        """A row's JSON, key and unchanged-TOAST columns; with ``hashed``, its row hash
        (None when the row's text is not all here)."""
        info = self._rel_info(rel)
        if len(values) != info.columns:
            raise PermanentError(
                f"pgoutput protocol: {len(values)} values for {info.columns} columns"
                f" of {rel.schema}.{rel.table}"
            )
        row_hash = info.hasher.hash(values) if hashed else None
        if info.apply is not None:
            values = info.apply(values)
        row, key, toast, kept = info.encoder.encode(values)
        if kept:
            # Bad input never stops the stream and never vanishes: the value travels as
            # the server's text, and is counted and logged.
            for name, reason in kept:
                self.unconverted += 1
                self._kept_log.warning(
                    f"{rel.schema}.{rel.table}.{name}",
                    "kept %s.%s.%s as text: %s",
                    rel.schema,
                    rel.table,
                    name,
                    reason,
                )
        return row, key if key is not None else b"{}", toast, row_hash

    def _envelope(self, op: str, lsn: int, rel: pg.Relation | None) -> Event:
        txn = self.txn
        if txn is None:
            raise PermanentError(f"pgoutput protocol: {op} outside a transaction")
        ev: Event = {"v": EVENT_VERSION, "op": op, "db": self.database}
        if rel is not None:
            ev["schema"] = rel.schema
            ev["table"] = rel.table
        ev["lsn"] = lsn
        # Position in the transaction: rows of one multi-row insert (COPY) share an LSN;
        # (commit_lsn, seq) is unique and the same on every redelivery.
        ev["seq"] = txn.events
        txn.events += 1
        ev["commit_lsn"] = txn.commit_lsn
        ev["xid"] = txn.xid
        ev["commit_ts"] = txn.commit_ts
        return ev

    def change(self, msg: pg.Insert | pg.Update | pg.Delete, lsn: int) -> list[Event]:
        """The events for one row change: none when skipped (no identity, ``skip``), one
        normally, two for an update that changed the row's key — a delete of the old key
        then an insert of the new row — so every event of a key stays under that key (and
        in one partition under primary-key keys)."""
        rel = self._rel(msg.relation_oid)
        has_key = self._rel_info(rel).has_key
        if not has_key and self.no_identity == "skip":
            self.skipped_no_identity += 1
            if rel.oid not in self._warned:
                self._warned.add(rel.oid)
                log.warning(
                    "skipping changes of %s.%s: no replica identity (add a primary key, or"
                    " set replication.no_identity=emit)",
                    rel.schema,
                    rel.table,
                )
            return []
        if msg.__class__ is pg.Insert:
            new = self._row(rel, msg.new, hashed=True)
            ev = self._event("insert", lsn, rel, new[1], new, None)
            if self._rel_info(rel).append_only:
                ev["append_only"] = True
            return [ev]
        if isinstance(msg, pg.Delete):
            before = self._row(rel, msg.old)
            gone = before[1] if msg.old_kind == "K" else before[0]
            return [self._event("delete", lsn, rel, before[1], None, gone)]
        assert isinstance(msg, pg.Update)
        new = self._row(rel, msg.new, hashed=True)
        old: Row | None = None
        if msg.old is not None:
            old = self._row(rel, msg.old)
        old_key = old[1] if old is not None else new[1]
        if has_key and old_key != new[1]:  # the encoding is canonical: bytes compare
            # pgoutput sends the old key ('K') only when it changed, or the whole old row
            # ('O') under FULL identity; either way the row moved to another key.
            assert old is not None
            gone = old[1] if msg.old_kind == "K" else old[0]
            return [
                self._event("delete", lsn, rel, old[1], None, gone),
                self._event("insert", lsn, rel, new[1], new, None),
            ]
        return [self._event("update", lsn, rel, new[1], new, old[0] if old else None)]

    def _event(
        self,
        op: str,
        lsn: int,
        rel: pg.Relation,
        key: bytes,
        new: Row | None,
        old: bytes | None,
    ) -> Event:
        ev = self._envelope(op, lsn, rel)
        info = self._rel_info(rel)
        # No key columns: an empty key, which routes by table (shared.contract.event).
        ev["key"] = orjson.Fragment(key) if info.has_key else {}
        ev["new"] = orjson.Fragment(new[0]) if new is not None else None
        ev["old"] = orjson.Fragment(old) if old is not None else None
        if new is not None:
            if new[2]:
                ev["unchanged_toast"] = new[2]
            if new[3] is not None:
                ev["hash"] = new[3]
        ev["types"] = info.types
        return ev

    def read(
        self,
        rel: pg.Relation,
        values: tuple[pg.Value, ...],
        version: int,
        seq: int,
        read_at: str,
        snapshot: SnapshotInfo,
    ) -> Event:
        """A snapshot row (``op: read``) from the row's text values as Postgres writes
        them (the same text pgoutput sends, so the same conversion): ``version`` is its
        ``lsn`` and ``commit_lsn``, ``seq`` its number in the chunk (see
        docs/snapshots.md for why a row carries the version it does)."""
        new = self._row(rel, values, hashed=True)
        ev: Event = {"v": EVENT_VERSION, "op": "read", "db": self.database, "schema": rel.schema,
                     "table": rel.table, "lsn": version, "seq": seq, "commit_lsn": version,
                     "xid": 0, "commit_ts": read_at}  # fmt: skip
        ev["key"] = orjson.Fragment(new[1]) if self._rel_info(rel).has_key else {}
        ev["new"] = orjson.Fragment(new[0])
        ev["old"] = None
        if new[3] is not None:
            ev["hash"] = new[3]
        ev["types"] = self._rel_info(rel).types
        ev["snapshot"] = snapshot
        if self._rel_info(rel).append_only:
            ev["append_only"] = True
        return ev

    def ddl(self, msg: pg.Message, lsn: int) -> list[Event]:
        """Events for a DDL message from the event triggers: one per table it touched.

        The message is transactional, so it sits in the stream exactly where the DDL
        committed: before any change that depends on it.
        """
        try:
            payload = orjson.loads(msg.content)
            tables, dropped = _ddl_shape(payload)
        except (orjson.JSONDecodeError, ValueError) as exc:
            # Anyone may call pg_logical_emit_message unless V004's REVOKE applies: a
            # malformed message must not stop the stream (and pin WAL) forever.
            self.malformed_ddl += 1
            log.warning("skipping a malformed DDL message at %s: %s", pg.format_lsn(lsn), exc)
            return []
        statement = payload.get("statement")
        if self.scrub_secrets and isinstance(statement, str):
            # current_query() is every statement the client sent at once: an ALTER TABLE
            # may travel with an ALTER ROLE ... PASSWORD.
            statement = scrub_statement(statement)
        if self.transforms is not None:
            # ... or with an UPDATE whose literals a rule protects, on any table.
            statement = WITHHELD
            self._check_ddl(tables, dropped, lsn)
        events: list[Event] = []
        for table in tables:
            ev = self._ddl_envelope(lsn, table["schema"], table["table"])
            columns = table["columns"]
            if self.transforms is not None:
                columns = self.transforms.ddl_columns(table["schema"], table["table"], columns)
            ev["ddl"] = {
                "tag": payload.get("tag"),
                "statement": statement,
                "columns": columns,
                "primary_key": table["primary_key"],
            }
            events.append(ev)
        for table in dropped:
            ev = self._ddl_envelope(lsn, table["schema"], table["table"])
            ev["ddl"] = {
                "tag": payload.get("tag"),
                "statement": statement,
                "dropped": True,
            }
            events.append(ev)
        return events

    def _check_ddl(
        self, tables: list[dict[str, Any]], dropped: list[dict[str, Any]], lsn: int
    ) -> None:
        """Every table of a DDL message against the shapes the rules knew, before any of
        its events is built (PermanentError: nothing of it is sent)."""
        assert self.transforms is not None
        for table in dropped:
            self.transforms.shapes.forget(table["schema"], table["table"])
        for table in tables:
            oid = table.get("oid")
            columns = [c for c in table["columns"] if isinstance(c, dict)]
            nums = [n for c in columns if type(n := c.get("num")) is int]
            self.transforms.shapes.check(
                oid if type(oid) is int else None,
                table["schema"],
                table["table"],
                [str(c.get("name")) for c in columns],
                session=self._session,
                lsn=self.txn.commit_lsn if self.txn is not None else None,
                where=f"the DDL event at LSN {pg.format_lsn(lsn)}",
                # the columns' attribute numbers (V009), by which a stop is recorded
                attnums=nums if len(nums) == len(columns) else None,
            )

    def _ddl_envelope(self, lsn: int, schema: str, table: str) -> Event:
        ev = self._envelope("ddl", lsn, None)
        out: Event = {"v": ev["v"], "op": "ddl", "db": ev["db"], "schema": schema, "table": table,
                      "lsn": ev["lsn"], "seq": ev["seq"], "commit_lsn": ev["commit_lsn"],
                      "xid": ev["xid"], "commit_ts": ev["commit_ts"]}  # fmt: skip
        out["key"] = {}
        out["new"] = None
        out["old"] = None
        return out

    def verify_marks(self, msg: pg.Message, lsn: int) -> list[Event]:
        """The ``op: verify`` markers of a verification mark message (V020's
        ``_walcast.verify_mark``: ``{"id", "tables": [{"schema", "table"}]}``), one per
        table, in the transaction that wrote it; none for a malformed one (logged: it
        must not stop the stream)."""
        try:
            payload = orjson.loads(msg.content)
            mark = payload["id"]
            tables = payload["tables"]
            if not (isinstance(mark, str) and 0 < len(mark) <= MAX_MARK_ID):
                raise ValueError("no id of 1 to 200 characters")
            if not isinstance(tables, list) or not all(
                isinstance(t, dict) and isinstance(t.get("schema"), str)
                and isinstance(t.get("table"), str) for t in tables
            ):  # fmt: skip
                raise ValueError("tables is not a list of {schema, table}")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("skipping a malformed verification mark at %s: %s", pg.format_lsn(lsn), exc)
            return []
        events = []
        for t in tables:
            ev = self._ddl_envelope(lsn, t["schema"], t["table"])
            ev["op"] = "verify"
            ev["verify"] = {"id": mark}
            events.append(ev)
        return events

    def truncate(self, msg: pg.Truncate, lsn: int) -> list[Event]:
        events = []
        for oid in msg.relation_oids:
            rel = self._rel(oid)
            ev = self._envelope("truncate", lsn, rel)
            ev["key"] = {}
            ev["new"] = None
            ev["old"] = None
            ev["types"] = self._rel_info(rel).types
            events.append(ev)
        return events


@dataclass
class _Pending:
    seq: int
    outstanding: int = 0
    end_lsn: int | None = None  # set at Commit


@dataclass
class AckTracker:
    """Which LSN is safe to confirm: the end LSN of the newest transaction such that it
    and every transaction before it were fully acknowledged by Kafka.

    Called on one thread (the pipeline's): ``open`` at Begin, ``sent`` per produced
    message, ``close`` at Commit, ``acked`` from the producer's delivery callback (which
    confluent-kafka runs inside ``poll`` on the same thread).
    """

    _txns: deque[_Pending] = field(default_factory=deque)
    _by_seq: dict[int, _Pending] = field(default_factory=dict)
    confirmed: int = 0

    def open(self, seq: int) -> None:
        p = _Pending(seq)
        self._txns.append(p)
        self._by_seq[seq] = p

    def sent(self, seq: int) -> None:
        self._by_seq[seq].outstanding += 1

    def acked(self, seq: int) -> None:
        p = self._by_seq.get(seq)
        if p is None:
            raise PermanentError(f"ack for unknown transaction {seq}")
        p.outstanding -= 1
        self._advance()

    def close(self, seq: int, end_lsn: int) -> None:
        self._by_seq[seq].end_lsn = end_lsn
        self._advance()

    def idle(self) -> bool:
        """No transaction is waiting for Kafka."""
        return not self._txns

    def advance_idle(self, lsn: int) -> None:
        """With nothing in flight, everything the server has sent up to ``lsn`` is done."""
        if not self._txns and lsn > self.confirmed:
            self.confirmed = lsn

    def is_done(self, seq: int) -> bool:
        """The transaction was fully acknowledged and confirmable."""
        return seq not in self._by_seq

    def in_flight(self) -> int:
        return len(self._txns)

    def _advance(self) -> None:
        while self._txns:
            head = self._txns[0]
            if head.end_lsn is None or head.outstanding > 0:
                return
            self._txns.popleft()
            del self._by_seq[head.seq]
            self.confirmed = max(self.confirmed, head.end_lsn)
