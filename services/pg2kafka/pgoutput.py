"""Decoder for the ``pgoutput`` logical replication protocol, version 1.

Pure functions over bytes: ``decode(payload)`` turns one XLogData payload into one of the
message dataclasses below. Column values stay as the server's text output (or the
:data:`UNCHANGED_TOAST` marker, or None for SQL NULL); converting them by type is
:mod:`services.pg2kafka.types`' job, because it needs the relation's column types.

Protocol reference: PostgreSQL documentation, "Logical Replication Message Formats".
Version 1 streams only committed transactions, whole, in commit order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from services.pg2kafka._native import decode_tuple

# Microseconds between the Unix epoch and the Postgres epoch (2000-01-01).
PG_EPOCH_OFFSET_US: Final = 946_684_800_000_000


class _UnchangedToast:
    """A value the server did not send because it is TOASTed and was not modified."""

    _instance: _UnchangedToast | None = None

    def __new__(cls) -> _UnchangedToast:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = _UnchangedToast()

Value = str | None | _UnchangedToast


class DecodeError(ValueError):
    """The payload does not follow the protocol (truncated, unknown tag)."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts_us: int  # microseconds since the Unix epoch
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    schema: str
    table: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[Column, ...]


@dataclass(frozen=True, slots=True)
class TypeMessage:
    oid: int
    schema: str
    name: str


# The row messages are built once per change: plain slotted classes (a frozen dataclass's
# __init__ sets each field through object.__setattr__, measurably slower). Treat them as
# read-only all the same.
@dataclass(slots=True)
class Insert:
    relation_oid: int
    new: tuple[Value, ...]


@dataclass(slots=True)
class Update:
    relation_oid: int
    new: tuple[Value, ...]
    # 'K': only the replica identity columns of the old row; 'O': the whole old row
    # (REPLICA IDENTITY FULL); None: the key did not change and identity is not FULL.
    old_kind: str | None
    old: tuple[Value, ...] | None


@dataclass(slots=True)
class Delete:
    relation_oid: int
    old_kind: str  # 'K' or 'O'
    old: tuple[Value, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_oids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


Decoded = (
    Begin | Commit | Relation | TypeMessage | Insert | Update | Delete | Truncate | Message | Origin
)

_I8 = struct.Struct("!b")
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")
_BEGIN = struct.Struct("!QqI")
_COMMIT = struct.Struct("!bQQq")


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, start: int = 0) -> None:
        self.buf = buf
        self.pos = start + 1  # past the tag byte

    def need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise DecodeError(f"truncated message: need {n} bytes at offset {self.pos}")

    def unpack(self, st: struct.Struct) -> tuple[int, ...]:
        self.need(st.size)
        values = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return values

    def byte(self) -> str:
        self.need(1)
        b = self.buf[self.pos]
        self.pos += 1
        return chr(b)

    def int8(self) -> int:
        return self.unpack(_I8)[0]

    def int16(self) -> int:
        return self.unpack(_I16)[0]

    def int32(self) -> int:
        return self.unpack(_I32)[0]

    def uint32(self) -> int:
        return self.unpack(_U32)[0]

    def int64(self) -> int:
        return self.unpack(_I64)[0]

    def string(self) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise DecodeError("unterminated string")
        raw = self.buf[self.pos : end]
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError:  # a name in a SQL_ASCII / LATIN1 database
            s = TEXT.decode(raw)
        self.pos = end + 1
        return s

    def raw(self, n: int) -> bytes:
        self.need(n)
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def tuple_data(self) -> tuple[Value, ...]:
        values, self.pos = _tuple_data(self.buf, self.pos)
        return values


# Postgres server encodings → Python codecs, for the ones a database may use besides UTF8.
_CODECS = {
    "LATIN1": "latin-1", "LATIN2": "iso8859-2", "LATIN9": "iso8859-15", "WIN1250": "cp1250",
    "WIN1251": "cp1251", "WIN1252": "cp1252", "KOI8R": "koi8-r", "EUC_JP": "euc_jp",
    "EUC_KR": "euc_kr", "EUC_CN": "gb2312", "ISO_8859_5": "iso8859-5",
    "ISO_8859_7": "iso8859-7", "ISO_8859_8": "iso8859-8",
}  # fmt: skip


class TextPolicy:
    """How text that is not UTF-8 is decoded. pgoutput sends values in the database's
    encoding, unconverted: in a ``SQL_ASCII`` (or LATIN1...) database a value need not
    be UTF-8, and a strict decode stopped the stream for good while WAL piled up.

    ``database`` (default): the database's own encoding; for ``SQL_ASCII``, which has
    none, Latin-1 — one character per byte, so the original bytes are the text encoded
    as Latin-1 again. ``replace``: U+FFFD for what is not UTF-8. Either way the value is
    counted (``undecodable``, exported as a metric) and the stream goes on. Set once per
    process from the replication connection (one database per process)."""

    def __init__(self) -> None:
        self.codec = "latin-1"
        self.errors = "strict"
        self.undecodable = 0

    def configure(self, server_encoding: str, policy: str) -> None:
        if policy == "replace":
            self.codec, self.errors = "utf-8", "replace"
        else:
            self.codec, self.errors = _CODECS.get(server_encoding.upper(), "latin-1"), "replace"

    def decode(self, raw: bytes) -> str:
        self.undecodable += 1
        return raw.decode(self.codec, self.errors)


TEXT = TextPolicy()


def _tuple_data(buf: bytes, pos: int) -> tuple[tuple[Value, ...], int]:
    """TupleData at ``pos``: the hot path of decoding, compiled (values are built straight
    from the buffer; text that is not UTF-8 goes through :data:`TEXT`)."""
    try:
        return decode_tuple(buf, pos, UNCHANGED_TOAST, TEXT.decode)  # type: ignore[return-value]
    except ValueError as exc:
        raise DecodeError(str(exc)) from None


def to_unix_us(pg_us: int) -> int:
    return pg_us + PG_EPOCH_OFFSET_US


_TAG_INSERT = ord("I")
_NEW_TUPLE = ord("N")


def decode(payload: bytes | memoryview) -> Decoded:
    """Decode one pgoutput message (the data part of an XLogData message)."""
    return decode_at(payload.tobytes() if isinstance(payload, memoryview) else payload, 0)


def decode_at(buf: bytes, start: int) -> Decoded:
    """Decode the pgoutput message that starts at ``start`` of ``buf`` and runs to its end
    (the replication stream's message, header and all: no copy of the payload)."""
    if len(buf) <= start:
        raise DecodeError("empty message")
    first = buf[start]
    if first == _TAG_INSERT and len(buf) >= start + 6 and buf[start + 5] == _NEW_TUPLE:
        (oid,) = _U32.unpack_from(buf, start + 1)  # the most frequent message
        values, _ = _tuple_data(buf, start + 6)
        return Insert(oid, values)
    r = _Reader(buf, start)
    tag = chr(first)
    if tag == "B":
        final_lsn, ts, xid = r.unpack(_BEGIN)
        return Begin(final_lsn, to_unix_us(ts), xid)
    if tag == "C":
        _flags, commit_lsn, end_lsn, ts = r.unpack(_COMMIT)
        return Commit(commit_lsn, end_lsn, to_unix_us(ts))
    if tag == "I":
        oid = r.uint32()
        if r.byte() != "N":
            raise DecodeError("insert without new tuple")
        return Insert(oid, r.tuple_data())
    if tag == "U":
        oid = r.uint32()
        kind = r.byte()
        old_kind: str | None = None
        old: tuple[Value, ...] | None = None
        if kind in ("K", "O"):
            old_kind, old = kind, r.tuple_data()
            kind = r.byte()
        if kind != "N":
            raise DecodeError(f"update without new tuple (got {kind!r})")
        return Update(oid, r.tuple_data(), old_kind, old)
    if tag == "D":
        oid = r.uint32()
        kind = r.byte()
        if kind not in ("K", "O"):
            raise DecodeError(f"delete without old tuple (got {kind!r})")
        return Delete(oid, kind, r.tuple_data())
    if tag == "R":
        oid = r.uint32()
        schema = r.string() or "pg_catalog"
        table = r.string()
        identity = chr(r.int8())
        ncols = r.int16()
        cols = []
        for _ in range(ncols):
            flags = r.int8()
            name = r.string()
            type_oid = r.uint32()
            typmod = r.int32()
            cols.append(Column(name, type_oid, typmod, bool(flags & 1)))
        return Relation(oid, schema, table, identity, tuple(cols))
    if tag == "Y":
        oid = r.uint32()
        schema = r.string() or "pg_catalog"
        return TypeMessage(oid, schema, r.string())
    if tag == "T":
        n = r.int32()
        options = r.int8()
        oids = tuple(r.uint32() for _ in range(n))
        return Truncate(oids, bool(options & 1), bool(options & 2))
    if tag == "M":
        flags = r.int8()
        lsn = r.int64()
        prefix = r.string()
        length = r.int32()
        return Message(bool(flags & 1), lsn, prefix, r.raw(length))
    if tag == "O":
        commit_lsn = r.int64()
        return Origin(commit_lsn, r.string())
    raise DecodeError(f"unknown pgoutput message tag {tag!r}")


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, sep, lo = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)
