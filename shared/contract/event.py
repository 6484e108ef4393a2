"""The walcast change event, version 1: its fields, operations, ordering key and the
one decoder every consumer reads it through.

The human-readable contract is ``docs/events.md``; the JSON Schema
``shared/schemas/change_event.v1.json`` is checked against this module
(``tests/unit/test_event_contract.py``), and every example in the docs is run through the
producer's schema, :func:`decode` and kafka2spark's envelope.

Producer side: pg2kafka builds a :class:`ChangeEvent` (a plain dict, built in
:data:`FIELDS` order so that a redelivered change encodes byte-identical) and
:func:`encode` s it.

Consumer side: :func:`decode` validates a record and returns an :class:`EventView`
without decoding the row: ``new`` and ``types`` stay raw JSON (a view into the record's
bytes) because a search sink writes the row on as it came, and a table's ``types`` repeat
in each of its events. Every rule a record can break raises :class:`EventDecodeError`
with a reason an operator can act on; consumers send such records to their dead-letter
topic or quarantine. This is a hot path (every record of every consumer passes through
it): checks are ``type(x) is ...`` identity tests and the view is a ``msgspec.Struct``
whose constructor runs in C.

Version rules: a field may be added to version 1 (consumers ignore fields they do not
read); removing or retyping a field, or changing what a value means, is version 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from functools import lru_cache
from types import MappingProxyType
from typing import Any, NamedTuple, TypedDict

import msgspec
import orjson

from shared.contract import keyranges
from shared.contract.keyranges import KeyRangesJson

EVENT_VERSION = 1
MAX_LSN = 2**63 - 1
MAX_ROW_HASH = 2**32 - 1  # shared/contract/rowhash.py: a sum modulo 2**32
"""The largest LSN a consumer accepts: the search engines' external version is a Java long."""
EPOCH_SHIFT = 48
"""A row's version is ``epoch << EPOCH_SHIFT | lsn``: the source's epoch orders before its
LSN (docs/snapshots.md, "A different source"). 2^48 bytes is 256 TiB of WAL; pg2kafka
refuses a server whose WAL position is beyond it."""
MAX_EPOCH = 2**15 - 1
"""The largest epoch: its version still fits a Java long."""
MAX_EPOCH_LSN = 2**EPOCH_SHIFT - 1
"""The largest LSN an event of epoch 1 or later carries."""


def version(epoch: int, lsn: int) -> int:
    """The number sinks compare: the epoch first, then the LSN (epoch 0: the LSN)."""
    return (epoch << EPOCH_SHIFT) | lsn if epoch else lsn


class Op(StrEnum):
    """What happened. Data operations carry a row; control operations change a table.
    ``read`` is a row a snapshot brought across (applied like an insert, versioned below
    every change the read did not see); ``snapshot`` marks the start and end of a table's
    snapshot (docs/events.md, "Snapshots")."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    TRUNCATE = "truncate"
    DDL = "ddl"
    READ = "read"
    SNAPSHOT = "snapshot"
    VERIFY = "verify"


DATA_OPS: tuple[str, ...] = (Op.INSERT, Op.UPDATE, Op.DELETE, Op.READ)
CONTROL_OPS: tuple[str, ...] = (Op.TRUNCATE, Op.DDL, Op.SNAPSHOT, Op.VERIFY)
SNAPSHOT_PHASES: tuple[str, ...] = ("start", "end", "range_end")
OPS: frozenset[str] = frozenset(Op)

FIELDS: tuple[str, ...] = (
    "v", "op", "db", "schema", "table", "lsn", "seq", "commit_lsn", "xid", "commit_ts",
    "key", "new", "old", "unchanged_toast", "hash", "types", "ddl", "oversized", "snapshot",
    "epoch", "append_only", "verify",
)  # fmt: skip
"""The envelope's fields, in the order the producer writes them."""
REQUIRED: tuple[str, ...] = ("v", "op", "db", "lsn", "seq", "commit_lsn", "xid", "commit_ts")


class DdlColumn(TypedDict):
    name: str
    type: str  # pg_type.typname, as in ``types``
    sql_type: str  # format_type(), e.g. numeric(8,2)
    nullable: bool
    num: int  # pg_attribute.attnum: kept through RENAME, never reused (V009)


class DdlChange(TypedDict, total=False):
    """``ddl`` of an ``op: ddl`` event: the table after the statement, or ``dropped``."""

    tag: str
    statement: str | None
    columns: list[DdlColumn]
    primary_key: list[str]
    dropped: bool


class SnapshotInfo(TypedDict, total=False):
    """``snapshot`` of a ``read`` row (``id``, ``chunk``) or of an ``op: snapshot``
    marker (``id``, ``phase``, and on the end marker ``rows``; on the end marker of a
    snapshot of key ranges, ``phase`` ``range_end`` and ``key_ranges``:
    :mod:`shared.contract.keyranges`)."""

    id: int
    chunk: int  # read rows: the chunk the row was read in
    phase: str  # markers: "start", "end" or "range_end"
    key_ranges: KeyRangesJson  # range_end: the key ranges the snapshot read
    rows: int  # end marker: rows the table's snapshot delivered
    source: dict[str, Any]  # start marker: {"system": identifier, "timeline": n} of the server read
    # an initial snapshot's start marker: the table's schema, as a DDL event's
    columns: list[dict[str, Any]]
    primary_key: list[str]


class VerifyMark(TypedDict):
    """``verify`` of an ``op: verify`` marker: the id its verifier gave it."""

    id: str


MAX_MARK_ID = 200  # characters of a verification mark's id (V020 refuses longer)


class ChangeEvent(TypedDict, total=False):
    """One change as the producer builds it (see docs/events.md for each field). pg2kafka
    holds ``key``, ``new``, ``old`` and ``types`` already encoded (``orjson.Fragment``:
    its compiled row encoder writes them); decoding gives plain objects."""

    v: int
    op: str
    db: str
    schema: str
    table: str
    lsn: int
    seq: int
    commit_lsn: int
    xid: int
    commit_ts: str
    key: dict[str, Any] | orjson.Fragment
    new: dict[str, Any] | orjson.Fragment | None
    old: dict[str, Any] | orjson.Fragment | None
    unchanged_toast: list[str]
    # The row hash of ``new`` (shared/contract/rowhash.py), on insert, update and read
    # rows whose text pg2kafka held entirely (not with ``unchanged_toast``).
    hash: int
    types: dict[str, str] | orjson.Fragment
    ddl: DdlChange
    oversized: int  # bytes of the change that was too large for Kafka (a reference event)
    snapshot: SnapshotInfo  # read rows and snapshot markers
    epoch: int  # the source's epoch, when above 0 (a restored or promoted source)
    # True on the rows of a table streamed without any replica identity
    # (filters.keyless_tables=inserts): an insert-only table, whose rows sinks append,
    # each under :func:`append_only_id` (docs/events.md, "Insert-only tables").
    append_only: bool
    verify: VerifyMark  # a verification marker (docs/design.md#verification)


def read_row_version(below_unseen: int, floor: int | None) -> int:
    """The version of a snapshot's ``read`` row — the rule every sink relies on.

    Below every change the read did not see (``below_unseen``: the slot's restart
    position - 1, under any transaction still open when the rows were read), so a change
    delivered later always wins; and above every table-level position a sink compares
    rows with (``floor``: the table's last truncate or creation — sinks keep out
    everything at or below it, so a read row under it would be dropped by a sink that
    does not even hold the row). A producer must know the floor across restarts
    (pg2kafka: ``_walcast.table_floors``). No change of the table sits between a floor and
    the next position: a truncate or a creation holds the table's lock until it commits.
    """
    return below_unseen if floor is None else max(below_unseen, floor + 1)


# The bookkeeping field (kafka2search) / column (kafka2spark) that names a held row's
# columns the sink could not fill: see :func:`fill_unfilled`.
UNFILLED = "_walcast_unfilled"

# What every sink stores with a row for ``verify`` (docs/design.md#verification): the row
# hash of the version it holds (``hash``; absent when unknown: an update that left a
# TOAST value out) and the transaction that wrote that version (``xid``; 0 for a read
# row). kafka2search: fields of the document; kafka2spark: columns of the mirror.
ROW_HASH = "_walcast_hash"
ROW_XID = "_walcast_xid"


def fill_unfilled(
    held: dict[str, Any], unfilled: list[str], older: dict[str, Any], older_unfilled: list[str]
) -> list[str]:
    """The rule for partial rows, the same in every sink: **a sink never refuses a full
    row in favour of a partial one.**

    An update that left a TOAST value unchanged does not carry it (``unchanged_toast``);
    a sink takes it from the row it holds. When it holds none — the row's earlier
    versions reached it only as a snapshot's ``read`` row still to come (a read row's
    version is *below* changes its content may already include:
    :func:`read_row_version`), or as an insert-only table's rows before the table gained
    its key — it writes the row without those columns and records them as ``unfilled``
    (:data:`UNFILLED`). A row that arrives later at an *older* version is then not
    refused outright: its values of the unfilled columns fill the held row, whose
    version stays. That value is the current one: a change that altered the column
    after the older row carries the column in full, and per-key order (one partition
    per key) brings it before the partial change that needed it.

    Moves into ``held`` the ``unfilled`` columns that ``older`` carries (and does not
    itself lack: ``older_unfilled``); returns the columns still unfilled."""
    rest: list[str] = []
    for column in unfilled:
        if column in older and column not in older_unfilled:
            held[column] = older[column]
        else:
            rest.append(column)
    return rest


def append_only_id(epoch: int, commit_lsn: int, seq: int, snapshot: SnapshotInfo | None) -> str:
    """The identity of one row of an insert-only table (``append_only``), decided here
    for every sink: the same on every redelivery, different for every row, so a sink that
    writes the row under it holds it exactly once. A change is its transaction's commit
    position and its place in it (rows of one COPY share an LSN, never a (commit, seq));
    a snapshot's read row is its run, chunk and place in the chunk — pg2kafka reads an
    insert-only table's chunk in ``ctid`` order, so a chunk read again after a restart
    numbers its rows the same way. It can look like a key's text (``1.5``): a sink that
    holds keyed and insert-only rows in one place keeps them apart (kafka2search: an
    ``append-only:`` prefix no key text keeps)."""
    head = f"{version(epoch, commit_lsn)}.{seq}"
    if snapshot is None:
        return head
    return f"{head}.s{snapshot['id']}.{snapshot['chunk']}"


class Position(NamedTuple):
    """Where a change sits in the source's history: unique per change and the same on
    every redelivery, so consumers recognise duplicates by it. Orders changes of one
    transaction; ``lsn`` (not this) is the version a row's sinks compare."""

    commit_lsn: int
    seq: int


def encode(event: ChangeEvent) -> bytes:
    """UTF-8 JSON, no whitespace, keys in the order built."""
    return orjson.dumps(event)


class JsonEventSerializer:
    """The producer's serializer (a :class:`shared.interfaces.Serializer`, checked where
    pg2kafka holds it as one): :func:`encode`; ``decode`` validates with :func:`decode`
    and returns the whole event as a dict (tools and tests; consumers use the view)."""

    def encode(self, item: ChangeEvent) -> bytes:
        return orjson.dumps(item)

    def decode(self, data: bytes) -> ChangeEvent:
        decode(data)
        event: ChangeEvent = orjson.loads(data)
        return event


class EventDecodeError(ValueError):
    """A record that is not a change event this code understands; the message is the
    reason a dead letter carries."""


_ABSENT = msgspec.Raw(b"")
_OPEN_BRACE = ord("{")
_NO_TYPES: Mapping[str, str] = MappingProxyType({})


class EventView(msgspec.Struct, gc=False):
    """The envelope as consumers read it. Scalars are untyped here so that
    :func:`decode` can say which rule a record broke; ``new`` and ``types`` are raw JSON
    (empty when absent). Not tracked by the garbage collector: it holds no cycles, and
    one is made per record."""

    v: Any = None
    op: Any = None
    db: Any = None
    schema: Any = None
    table: Any = None
    lsn: Any = None
    key: Any = None
    new: msgspec.Raw = _ABSENT
    types: msgspec.Raw = _ABSENT
    unchanged_toast: Any = None
    hash: Any = None
    ddl: Any = None
    oversized: Any = None
    snapshot: Any = None
    epoch: Any = None
    append_only: Any = None
    verify: Any = None
    commit_lsn: Any = None
    seq: Any = None
    xid: Any = None

    def version(self) -> int:
        """What a sink compares to order two writes of a row: ``lsn`` within an epoch,
        and any change of a later epoch (a new source) after every one of an earlier."""
        return (self.epoch << EPOCH_SHIFT) | self.lsn if self.epoch else self.lsn  # type: ignore[no-any-return]

    def row_id(self) -> str | None:
        """The :func:`append_only_id` of a row of an insert-only table; None for any
        other event (its rows are identified by ``key``)."""
        if self.append_only is not True:
            return None
        return append_only_id(self.epoch or 0, self.commit_lsn, self.seq, self.snapshot)

    def column_types(self) -> Mapping[str, str]:
        """Column → Postgres type name; shared between events, never to be mutated."""
        if not self.types:
            return _NO_TYPES
        last = _last_types  # (raw, decoded) of the previous call: most often the same
        if self.types == last[0]:  # compares the JSON text, without copying it
            return last[1]
        return _remember_types(self.types)

    def row(self) -> dict[str, Any] | None:
        """``new`` decoded (a copy: the view keeps the raw text)."""
        if not self.new:
            return None
        row: dict[str, Any] | None = orjson.loads(bytes(self.new))
        return row


_decode_view = msgspec.json.Decoder(EventView).decode
_decode_types = msgspec.json.Decoder(dict[str, str]).decode


@lru_cache(maxsize=1024)
def _column_types(raw: bytes) -> Mapping[str, str]:
    try:
        return _decode_types(raw)
    except msgspec.ValidationError as exc:
        raise EventDecodeError(f"field 'types' is not an object of type names: {exc}") from exc
    except UnicodeDecodeError:
        raise EventDecodeError("field 'types' is not valid UTF-8") from None


def _remember_types(raw: msgspec.Raw) -> Mapping[str, str]:
    global _last_types
    types = _column_types(bytes(raw))
    # One tuple: a reader on another thread sees a whole pair. A copy of the text: the
    # event's Raw would keep its whole record alive.
    _last_types = (raw.copy(), types)
    return types


_last_types: tuple[msgspec.Raw, Mapping[str, str]] = (_ABSENT, _NO_TYPES)


def _shown(value: Any) -> str:
    """A field's value in a reason: its repr, at most 60 characters (a record's fields can
    hold anything, however large or deep)."""
    if isinstance(value, (list, dict)) and len(value) > 10:
        return f"a JSON {'array' if isinstance(value, list) else 'object'}"
    try:
        text = repr(value[:61] if isinstance(value, str) else value)
    except RecursionError:
        return "a deeply nested JSON value"
    return text if len(text) <= 60 else text[:59] + "…"


def decode(value: bytes | None) -> EventView:
    """A record's value as an event, validated, or :class:`EventDecodeError`."""
    if value is None:
        raise EventDecodeError("empty record (no value)")
    try:
        ev = _decode_view(value)
    except msgspec.ValidationError:  # every field takes any JSON value but the record
        raise EventDecodeError("not a JSON object") from None
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"not JSON: {exc}") from exc
    except UnicodeDecodeError as exc:  # msgspec checks a string's UTF-8 as it reads it
        raise EventDecodeError(f"not JSON: invalid UTF-8 at byte {exc.start}") from None
    except RecursionError:
        raise EventDecodeError("not JSON: nested too deeply") from None
    if ev.v != EVENT_VERSION:
        raise EventDecodeError(f"unknown event version {_shown(ev.v)} (supported: 1)")
    op = ev.op
    if type(op) is not str or op not in OPS:
        raise EventDecodeError(f"unknown op {_shown(op)}")
    if type(ev.schema) is not str or type(ev.table) is not str or type(ev.db) is not str:
        for name in ("schema", "table", "db"):
            if type(getattr(ev, name)) is not str:
                raise EventDecodeError(f"field {name!r} missing or not a string")
    if type(ev.lsn) is not int or not 0 <= ev.lsn <= MAX_LSN:
        raise EventDecodeError("field 'lsn' missing or not an integer from 0 to 2^63-1")
    if ev.epoch is not None:
        if type(ev.epoch) is not int or not 0 <= ev.epoch <= MAX_EPOCH:
            raise EventDecodeError(f"field 'epoch' not an integer from 0 to {MAX_EPOCH}")
        if ev.epoch and ev.lsn > MAX_EPOCH_LSN:
            raise EventDecodeError(f"field 'lsn' above 2^{EPOCH_SHIFT}-1 in epoch {ev.epoch}")
    if ev.oversized is not None:
        raise EventDecodeError(
            f"a reference to a change of {_shown(ev.oversized)} bytes, larger than Kafka accepts"
            f" (key and LSN {ev.lsn} kept, row not carried): re-snapshot the row"
        )
    if op in DATA_OPS:
        if type(ev.key) is not dict:
            raise EventDecodeError("field 'key' missing or not an object")
        # The first byte of a view, not a copy of the row (an absent row is empty).
        if op != "delete" and (not ev.new or memoryview(ev.new)[0] != _OPEN_BRACE):
            raise EventDecodeError(f"{op} without a 'new' row")
        if ev.types:
            ev.column_types()  # validated (once per distinct value)
        toast = ev.unchanged_toast
        if toast is not None and (
            type(toast) is not list or not all(type(c) is str for c in toast)
        ):
            raise EventDecodeError("field 'unchanged_toast' is not a list of column names")
        h = ev.hash
        if h is not None and (type(h) is not int or not 0 <= h <= MAX_ROW_HASH):
            raise EventDecodeError(f"field 'hash' not an integer from 0 to {MAX_ROW_HASH}")
        if op == "read" and ev.snapshot is not None and type(ev.snapshot) is not dict:
            raise EventDecodeError("field 'snapshot' is not an object")
    elif op == "snapshot":
        info = ev.snapshot
        if type(info) is not dict:
            raise EventDecodeError("snapshot event without a 'snapshot' object")
        if info.get("phase") not in SNAPSHOT_PHASES:
            raise EventDecodeError(
                "snapshot 'phase' missing or not 'start', 'end' or 'range_end':"
                f" {_shown(info.get('phase'))}"
            )
        if info["phase"] == "range_end":
            try:
                keyranges.parse(info.get("key_ranges"))
            except ValueError as exc:
                raise EventDecodeError(f"snapshot {exc}") from None
        sid = info.get("id")
        if type(sid) is not int or not 0 <= sid <= MAX_LSN:
            raise EventDecodeError("snapshot 'id' missing or not an integer from 0 to 2^63-1")
    elif op == "verify":
        mark = ev.verify
        if type(mark) is not dict or type(mark.get("id")) is not str:
            raise EventDecodeError("verify event without a 'verify' object with a string 'id'")
        if not 0 < len(mark["id"]) <= MAX_MARK_ID:
            raise EventDecodeError(
                f"verify 'id' of {len(mark['id'])} characters (1 to {MAX_MARK_ID})"
            )
    elif op == "ddl":
        ddl = ev.ddl
        if type(ddl) is not dict:
            raise EventDecodeError("ddl event without a 'ddl' object")
        columns = ddl.get("columns")
        if columns is not None and not (
            isinstance(columns, list)
            and all(
                isinstance(c, dict) and type(c.get("name")) is str and type(c.get("type")) is str
                for c in columns
            )
        ):
            raise EventDecodeError("ddl 'columns' is not a list of {name, type} objects")
    return ev


def checked_row_id(ev: EventView) -> str | None:
    """The row id of an ``append_only`` event (:meth:`EventView.row_id`), the fields it
    is made of checked first (the decoder does not check them): None for any other
    event; :class:`EventDecodeError` when one is missing or of the wrong type."""
    if ev.append_only is not True:
        return None  # not a boolean true: an ordinary row, identified by its key
    if type(ev.commit_lsn) is not int or type(ev.seq) is not int:
        raise EventDecodeError("an append_only row without integer 'commit_lsn' and 'seq'")
    snap = ev.snapshot
    if snap is not None and not (
        type(snap) is dict and type(snap.get("id")) is int and type(snap.get("chunk")) is int
    ):
        raise EventDecodeError("an append_only row whose 'snapshot' lacks an integer id / chunk")
    if ev.epoch is not None and type(ev.epoch) is not int:
        raise EventDecodeError("an append_only row whose 'epoch' is not an integer")
    return ev.row_id()
