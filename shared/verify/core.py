"""The comparison at the heart of ``verify`` (docs/design.md#verification): what each side
gives, and how a key is judged. Pure: no I/O here; the two sides are protocols.

- :class:`VerifySource` is the Postgres side (:class:`~shared.verify.postgres.PostgresSource`):
  key ranges with their count and hash sum, each read in a short transaction whose
  snapshot comes with it; a range's rows with their hash and ``xmin``; a marker.
- :class:`VerifyTarget` is a sink's side (each sink implements it): the same count and
  hash sum per range, a range's rows with the hash and transaction of the version held,
  and a wait until everything up to a marker is applied on every partition.

:func:`judge` decides one key from what both sides hold; :func:`compare_ranges` which
ranges need their rows looked at.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shared.contract.keyorder import INTEGER_KEY_TYPES, TIME_KEY_TYPES, key_text

Key = tuple[object, ...]

XID_SPACE = 1 << 32
FIRST_NORMAL_XID = 3  # 0: invalid (a snapshot's read row), 1: bootstrap, 2: frozen


@dataclass(frozen=True)
class Snapshot:
    """A Postgres snapshot as ``pg_current_snapshot()`` gives it (64-bit ids): every
    transaction below ``xmin`` is finished, every one from ``xmax`` on not yet; those in
    ``xip`` were in progress. Top-level transaction ids, as change events carry them."""

    xmin: int
    xmax: int
    xip: frozenset[int]
    # The next transaction id read after the sink was read (None: not known). No version
    # the sink held then can have a later writer: an id that places at or beyond it is an
    # old one from 2^31 or more transactions ago, long visible.
    horizon: int | None = None

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        """``'xmin:xmax:xip,xip,...'``, the type's text output. ValueError otherwise."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"not a snapshot: {text!r}")
        xip = frozenset(int(x) for x in parts[2].split(",") if x)
        return cls(int(parts[0]), int(parts[1]), xip)

    def full(self, xid32: int) -> int:
        """A 32-bit transaction id (an event's ``xid``) as a 64-bit one: the one with
        those low bits nearest ``xmax`` (Postgres keeps every live id within 2^31 of the
        next one; a sink's may also be a little past the snapshot: written after it)."""
        full = (self.xmax & ~(XID_SPACE - 1)) | (xid32 & (XID_SPACE - 1))
        if full > self.xmax + XID_SPACE // 2:
            return full - XID_SPACE
        if full < self.xmax - XID_SPACE // 2:
            return full + XID_SPACE
        return full

    def sees(self, xid32: int) -> bool:
        """Whether the transaction that wrote a version is visible in this snapshot. A
        read row (xid 0) and the special ids count as visible: a read row's data is a
        committed state, older than every change its read did not see."""
        if xid32 < FIRST_NORMAL_XID:
            return True
        x = self.full(xid32)
        if self.horizon is not None and x >= self.horizon:
            return True
        return x < self.xmin or (x < self.xmax and x not in self.xip)


@dataclass(frozen=True)
class KeyRange:
    """The keys ``lower`` < key <= ``upper`` in the table's key order (None: unbounded).
    A table's ranges cover every key: the first has no lower bound, the last no upper."""

    lower: Key | None
    upper: Key | None

    def __str__(self) -> str:
        lo = "(" if self.lower is None else f"({_show(self.lower)}"
        hi = ")" if self.upper is None else f"{_show(self.upper)}]"
        return f"{lo}, {hi}"


def _show(key: Key) -> str:
    return ", ".join(map(str, key)) if len(key) > 1 else str(key[0])


@dataclass(frozen=True)
class Summary:
    """A range as one side holds it: rows, the sum of their hashes, and (a sink) how many
    rows have no known hash (their sum is then of the others) and how many were changed
    by another writer (when the sink can tell from a summary: ``verify --values``)."""

    rows: int
    hash_sum: int
    unknown: int = 0
    # rows another writer changed inside the sink (a value edited through the engine's
    # API, a Delta UPDATE): the hash the sink keeps no longer describes the row it holds
    edited: int = 0


@dataclass(frozen=True)
class SourceRange:
    """A range Postgres read: its bounds, its summary, the snapshot it was read in."""

    range: KeyRange
    summary: Summary
    snapshot: Snapshot


@dataclass(frozen=True)
class SourceRow:
    key: Key
    hash: int
    xmin: int  # the 32-bit id of the tuple version's writer (a subtransaction's own)


@dataclass(frozen=True)
class SinkRow:
    key: Key
    hash: int | None  # None: unknown (an update that left a TOAST value out)
    xid: int  # the top-level transaction that wrote the version held; 0: a read row
    # changed inside the sink by another writer since the sink service wrote it: its
    # values are not the version's, whatever its hash says
    edited: bool = False


class Verdict(enum.Enum):
    EQUAL = "equal"
    CHANGED = "changed"  # the sink holds a version the read did not see: look again
    DIFFERS = "differs"
    EXTRA = "extra"
    MISSING = "missing"  # to confirm: Postgres still has it, unchanged, after the sink's read
    UNKNOWN = "unknown"  # the sink's hash is unknown: compared by reading the row again


def judge(source: SourceRow | None, sink: SinkRow | None, snapshot: Snapshot) -> Verdict:
    """One key, from Postgres's row in ``snapshot`` and the sink's, once the sink applied
    everything visible in ``snapshot`` (docs/design.md#verification, step 5)."""
    if source is None and sink is None:
        return Verdict.EQUAL
    if sink is None:
        return Verdict.MISSING
    if source is not None and sink.hash == source.hash and not sink.edited:
        return Verdict.EQUAL
    if not snapshot.sees(sink.xid):
        return Verdict.CHANGED
    if source is None:
        return Verdict.EXTRA
    if sink.hash is None and not sink.edited:
        return Verdict.UNKNOWN
    return Verdict.DIFFERS  # another hash, or values another writer changed


def judge_rows(
    source: Sequence[SourceRow], sink: Sequence[SinkRow], snapshot: Snapshot
) -> Iterator[tuple[Key, Verdict]]:
    """Every key either side holds in a range, with its verdict (equal ones included),
    in key order."""
    ours = {r.key: r for r in source}
    theirs = {r.key: r for r in sink}
    for key in sorted(ours.keys() | theirs.keys(), key=key_order):
        yield key, judge(ours.get(key), theirs.get(key), snapshot)


def key_value(pg_type: str, v: Any) -> object:
    """A key value read from a sink, as Postgres's side reads it: integers as ``int``,
    a ``uuid`` as :class:`uuid.UUID`, a date or timestamp as the text events carry
    (:func:`~shared.contract.keyorder.key_text`, from a sink's text or its ``date`` /
    ``datetime``), text as ``str`` (the key types verify reads:
    :data:`shared.contract.keyorder.ORDERED_KEY_TYPES`)."""
    if pg_type == "uuid":
        return uuid.UUID(str(v))
    if pg_type in INTEGER_KEY_TYPES:
        return int(v)
    if pg_type in TIME_KEY_TYPES:
        return key_text(v)
    return str(v)


def key_order(key: Key) -> tuple[tuple[int, int, str], ...]:
    """The order of keys every side shares (:mod:`shared.contract.keyorder`): integers by
    value, UUIDs by their bytes (as their canonical text sorts), text — dates and
    timestamps as events write them too — by code point."""
    return tuple((0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in key)


def compare_ranges(source: Sequence[SourceRange], sink: Sequence[Summary]) -> list[SourceRange]:
    """The ranges whose summaries differ (rows looked at next): a different count or
    hash sum, sink rows of unknown hash or edited by another writer."""
    if len(source) != len(sink):
        raise ValueError(f"{len(source)} source ranges, {len(sink)} sink summaries")
    return [s for s, t in zip(source, sink, strict=True) if t.unknown or t.edited or s.summary != t]


class VerifySource(Protocol):
    """The Postgres side of a verification. Every call runs its own short transaction(s);
    none holds one open between calls. Reading is paced by the implementation's rate."""

    def ranges(self, table: tuple[str, str], max_rows: int) -> Iterator[SourceRange]:
        """The table's key ranges, in key order, each of at most ``max_rows`` rows when
        read, with its summary and the snapshot it was read in; together they cover
        every key (the last is unbounded above)."""
        ...

    def rows(self, table: tuple[str, str], rng: KeyRange) -> tuple[list[SourceRow], Snapshot]:
        """The range's rows and the snapshot they were read in."""
        ...

    def mark(self, mark_id: str, tables: Sequence[tuple[str, str]]) -> int:
        """Ask pg2kafka for a verification marker on each table (committed on return); a
        WAL position at or after the marker's commit (a slot past it has streamed it)."""
        ...

    def wait_streamed(self, slot: str, lsn: int, timeout_s: float) -> None:
        """Return once pg2kafka's slot has passed ``lsn`` (every copy of a marker there
        is in Kafka); raise after ``timeout_s``."""
        ...

    def next_xid(self) -> int:
        """The next transaction id Postgres will assign (64-bit), without assigning one."""
        ...

    def oldest_xid(self) -> int:
        """The oldest transaction id still running (a snapshot taken now has it as its
        xmin; 64-bit): every transaction below it has ended."""
        ...


class VerifyTarget(Protocol):
    """A sink's side of a verification. Reads only; a failure raises (the verification
    stops and says so; nothing is judged from a partial read)."""

    def summaries(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[Summary]:
        """Each range's summary as the sink holds it, in the order given."""
        ...

    def rows(self, table: tuple[str, str], rng: KeyRange) -> list[SinkRow]:
        """The range's rows as the sink holds them."""
        ...

    def before_mark(self, tables: Sequence[tuple[str, str]]) -> None:
        """Note where the tables' partitions end now: a marker asked for next lies after."""
        ...

    def prefetch(self, table: tuple[str, str]) -> None:
        """Called while the first round's marker is awaited (on another thread, before
        :meth:`summaries`): read ahead what the summaries need, if that is cheaper later.
        :meth:`summaries` must still answer for the sink as it is after the marker (use
        what was read ahead only if nothing changed since). May do nothing."""
        ...

    def wait_for_mark(
        self, mark_id: str, tables: Sequence[tuple[str, str]], timeout_s: float
    ) -> None:
        """Return once the sink has applied everything up to the marker ``mark_id`` on
        every partition of the tables' topics; raise (saying what it waited for and how
        far the sink got) after ``timeout_s`` without progress."""
        ...
