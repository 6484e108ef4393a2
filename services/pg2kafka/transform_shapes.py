"""Transform rules against renames: the shapes tables reach the stream in.

Rules (services/pg2kafka/transforms.py) name columns, and a rename carries a column out
from under its rule: with ``public.users.email: redact``, ``RENAME COLUMN email TO
contact_email`` would send the address in the clear. So every shape a table reaches the
stream in — a pgoutput Relation message (every install: it precedes the relation's first
row after any change) and a DDL event's table (where DDL capture is installed: it comes
before the change's rows) — is held against the last shape the process knows of that
table, and a column a rule covered that is not covered any more stops the stream there
(:meth:`Shapes.check`): before a row of the new shape is converted, before the DDL event
is sent, inside the transaction, so the slot is not confirmed past it and a restart with
changed rules resumes there. Stopping, not following the column by its number: pgoutput's
Relation messages carry names only, and an operator reads "rule X no longer covers
anything, name the new column" more easily than a rule that silently follows a column.

The first known shape of a table is the catalog read at start-up (after the rules were
checked against it), else the first one the stream shows. Shapes have an order: a
session's stream is ordered; across sessions (a reconnect, a restart) by commit LSN — a
replay may show a table *older* than the catalog or the last session saw it, which is
held against that later shape the other way round.

A stop must outlive the process: pgoutput sends a relation's new shape once, before its
first change in a session, so a restart at the stopping transaction with unchanged rules
would see nothing to compare when a rule still matches something in the table (a
wildcard). Before raising, :meth:`Shapes.check` hands the columns that lost their rule
to ``Shapes.recorder`` (:class:`Stop`: by table oid and attribute number, which a rename
keeps), and each session's first shape waits for ``Shapes.guard`` to clear the recorded
stops (services/pg2kafka/transform_stops.py). Attribute numbers come with the start-up
catalog and with DDL events.

A name is not a column: ``RENAME email TO email_old; ADD COLUMN email text`` keeps the
name ``email`` while the addresses move to ``email_old``. So a covered column is followed
by its attribute number where one is known: a DDL event's ``num`` gives the new shape's
numbers; for a Relation message (names only) :attr:`Shapes.catalog` reads the table's
current columns by oid (services/pg2kafka/transform_stops.py, :func:`columns`), and the
column a rule covered counts as kept only when its number is, in the new shape, under a
name a rule covers (:func:`_moved`). The catalog may be ahead of the stream (later DDL
already applied): a number is mapped to its current name only when the message shows
that name, and a number the catalog has under no name the message shows — or no more —
is a stop whenever the message shows a name the catalog no longer has (that name may
hold it).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from services.pg2kafka.filters import INTERNAL_SCHEMA, TableFilter
from shared.errors import PermanentError

Covered = Callable[[str, str, Iterable[str]], dict[str, str]]
"""``covered(schema, table, names)``: the names a rule applies to -> the rule's pattern."""

CatalogColumns = Callable[[int], "list[tuple[int, str, bool]] | None"]
"""``catalog(table oid)``: the table's columns now — ``(attnum, name, generated)`` in
attribute order, dropped ones left out — or None when there is no such table."""


@dataclass(frozen=True, slots=True)
class Stop:
    """A column that lost its rule, to be recorded before the stream stops.

    ``oid``: its table's (None: the message did not say, and the recorder finds the table
    by ``now_schema``.``now_table``); ``attnum``: its attribute number, exact when known
    (None: the recorder looks up ``now_column``, a name in the stopping shape that may
    hold the column's data, in the catalog); ``schema``, ``table``, ``column``: its names
    while the rule ``rule`` covered it; ``now_*``: the table's names in the stopping shape
    and, with no ``attnum``, the candidate column (one Stop per candidate)."""

    oid: int | None
    attnum: int | None
    schema: str
    table: str
    column: str
    rule: str
    now_schema: str
    now_table: str
    now_column: str | None = None


@dataclass(frozen=True, slots=True)
class _Seen:
    """A shape of a table as last seen: its name, its columns and those rules covered in
    it (column -> the rule's pattern). ``lsn``: the commit LSN of the transaction it was
    seen in (for the catalog at start-up: the WAL position after reading it);
    ``session``: the event builder that saw it (None: the catalog at start-up);
    ``attnums``: the covered columns' attribute numbers, where known."""

    schema: str
    table: str
    names: frozenset[str]
    covered: dict[str, str]
    lsn: int | None
    session: int | None
    attnums: dict[str, int]


class Shapes:
    """The last known shape of each table with a covered column, by relation oid (or by
    name, from a DDL event without one). Thread-safe: the sessions of a process share
    it."""

    def __init__(self, covered: Covered) -> None:
        self._covered = covered
        self._seen: dict[int | tuple[str, str], _Seen] = {}
        self._lock = threading.Lock()
        self._sessions = itertools.count(1)
        self.streamed: TableFilter | None = None  # set by remember_catalog
        # Set by the start-up check (services/pg2kafka/transforms.py, check_database):
        # ``recorder`` persists the stops before they are raised (an exception from it is
        # raised instead: the stream does not pass a stop it could not record); ``guard``
        # raises PermanentError while a recorded stop is unresolved, called before each
        # session's first shape is taken.
        self.recorder: Callable[[list[Stop]], None] | None = None
        self.guard: Callable[[], None] | None = None
        # ``catalog`` (set there too) reads a table's current attribute numbers for a
        # Relation message's shape (names only); None: shapes are compared by name.
        self.catalog: CatalogColumns | None = None
        self._guarded: set[int] = set()

    def session(self) -> int:
        """A token for one event builder's stream (see :meth:`check`)."""
        return next(self._sessions)

    def check(
        self,
        oid: int | None,
        schema: str,
        table: str,
        names: Sequence[str],
        *,
        session: int,
        lsn: int | None,
        where: str,
        attnums: Sequence[int] | None = None,
    ) -> None:
        """Called with each shape of a table before anything of it is converted or sent:
        a pgoutput Relation message (``oid``), a DDL event's table (its ``oid`` when the
        message has one; else found by name). ``session``: the builder's token
        (:meth:`session`); ``lsn``: the commit LSN of the transaction it came in (None:
        unknown); ``where``: the message, for the error; ``attnums``: the attribute
        numbers of ``names`` (a DDL event's ``num``), when the message has them. The
        session's first shape first waits for :attr:`guard` (a recorded stop still
        unresolved: PermanentError). Compared with the last shape
        known of the table (only for a table the filters stream), it raises
        PermanentError, remembering nothing, when data a rule covered may go out
        uncovered:

        * that shape is earlier in the stream (this session's, or older than ``lsn``):
          a column a rule covered there is not a covered column here — renamed, or the
          table renamed or moved to another schema (or the column dropped: names alone
          cannot tell a drop from a rename);
        * it is later (the start-up catalog, or a previous session, ahead of a replay):
          a column it covers is here without a rule (the table had another name), or is
          missing while this shape has a column it lacks (renamed since).

        Either way, a column a rule covered whose attribute number is known is followed
        by it (:func:`_moved`): lost when its number is here under a name no rule covers,
        or may be (the catalog, read through :attr:`catalog` for a message without
        numbers, has it under no name shown here while a name shown here is gone from
        it). A failure of that read raises (psycopg's error): nothing of the shape is
        taken, and the stream tries again.

        Before raising, the lost columns go to :attr:`recorder` (:class:`Stop`).
        Otherwise this shape is remembered as the table's latest."""
        if schema == INTERNAL_SCHEMA:
            return
        if self.guard is not None and session not in self._guarded:
            self.guard()
            self._guarded.add(session)
        numbered = dict(zip(names, attnums, strict=True)) if attnums is not None else None
        now = self._now(oid, schema, table, names) if numbered is None else None
        with self._lock:
            key, prev = self._previous(oid, schema, table)
            covered = self._covered(schema, table, names)
            streamed = self.streamed is None or self.streamed.matches(schema, table)
            lost: list[str] = []
            notes: dict[str, str] = {}
            if prev is not None and streamed:
                notes = _moved(prev, covered, names, numbered, now)
                lost = sorted(set(_lost_columns(prev, covered, names, session, lsn)) | set(notes))
            if not lost:
                if key is not None:
                    self._seen.pop(key, None)
                if covered:
                    self._seen[oid if oid is not None else (schema, table)] = _Seen(
                        schema, table, frozenset(names), covered, lsn, session,
                        _numbers(covered, names, numbered, now, prev),
                    )  # fmt: skip
                return
        assert prev is not None
        table_oid = oid if oid is not None else key if isinstance(key, int) else None
        error = _lost(prev, lost, schema, table, names, where, notes)
        if self.recorder is not None:
            self.recorder(_stops(prev, lost, table_oid, schema, table, names, covered, numbered))
        raise error

    def _now(
        self, oid: int | None, schema: str, table: str, names: Sequence[str]
    ) -> _Catalog | None:
        """The table's columns in the catalog now, for a shape without numbers: read (one
        query) only when there is a catalog to read, the message gives the table's oid,
        and the table has a covered column — in the last known shape, or in this one."""
        if self.catalog is None or oid is None:
            return None
        with self._lock:
            _key, prev = self._previous(oid, schema, table)
        if (prev is None or not prev.attnums) and not self._covered(schema, table, names):
            return None
        return _Catalog(self.catalog(oid), names)

    def _previous(
        self, oid: int | None, schema: str, table: str
    ) -> tuple[int | tuple[str, str] | None, _Seen | None]:
        if oid is not None and oid in self._seen:
            return oid, self._seen[oid]
        for key, seen in self._seen.items():
            # By name: for a DDL event without an oid any shape under that name; for a
            # Relation message only what such a DDL event left (a table of the same name
            # under another oid is another table).
            if (seen.schema, seen.table) == (schema, table) and (
                oid is None or isinstance(key, tuple)
            ):
                return key, seen
        return None, None

    def forget(self, schema: str, table: str) -> None:
        """The table was dropped (a DDL event): a new one may take its name."""
        with self._lock:
            gone = [k for k, v in self._seen.items() if (v.schema, v.table) == (schema, table)]
            for key in gone:
                del self._seen[key]

    def remember_catalog(
        self, columns: Iterable[tuple[int, str, str, str, int]], streamed: TableFilter, lsn: int
    ) -> None:
        """The catalog read at start-up — ``(table oid, schema, table, column, attnum)``
        rows (attnum 0: unknown) — as
        the first known shape of every streamed table with a covered column (``lsn``: the
        WAL position after it was read), so a table whose first change after start comes
        after a rename is compared too. ``streamed``: the filters (a table they leave out
        sends nothing, and is not held to its shape)."""
        by_table: dict[tuple[int, str, str], list[str]] = {}
        numbers: dict[tuple[int, str], int] = {}
        for oid, schema, table, column, attnum in columns:
            if streamed.matches(schema, table):
                by_table.setdefault((oid, schema, table), []).append(column)
                numbers[(oid, column)] = attnum
        with self._lock:
            self.streamed = streamed
            for (oid, schema, table), names in by_table.items():
                covered = self._covered(schema, table, names)
                if covered and oid not in self._seen:
                    nums = {n: numbers[(oid, n)] for n in covered if numbers.get((oid, n))}
                    self._seen[oid] = _Seen(
                        schema, table, frozenset(names), covered, lsn, None, nums
                    )


class _Catalog:
    """A table's columns in the catalog now, against a shape ``names`` of it from the
    stream. ``exact``: the catalog shows that shape (the same columns, in attribute
    order, as pgoutput sends them — generated columns it does not send aside), so its
    numbers are the shape's; ``stale``: a name the shape shows is gone from the catalog
    (renamed or dropped since — a column of the shape the catalog cannot place);
    ``gone``: the table is not in the catalog any more (dropped since)."""

    def __init__(self, rows: Iterable[tuple[int, str, bool]] | None, names: Sequence[str]) -> None:
        self.gone = rows is None
        rows = list(rows or ())
        shown = set(names)
        self.name_of = {attnum: name for attnum, name, _gen in rows}
        self.number_of = {name: attnum for attnum, name in self.name_of.items()}
        order = [name for attnum, name, gen in rows if not (gen and name not in shown)]
        self.exact = order == list(names)
        self.stale = any(n not in self.number_of for n in names)


def _moved(
    prev: _Seen,
    covered: dict[str, str],
    names: Sequence[str],
    numbered: dict[str, int] | None,
    now: _Catalog | None,
) -> dict[str, str]:
    """The columns of ``prev`` a rule covered, with a known attribute number, whose data
    is (or may be) in the new shape under a name no rule covers -> what is known of it.
    ``numbered``: the shape's own numbers (a DDL event); else ``now``, the catalog (a
    Relation message; None: not read, nothing to compare). A number absent from an exact
    shape was dropped: nothing of it is left to send. A table gone from the catalog
    (dropped since) tells nothing: a shape that shows other names than ``prev`` stops."""
    out: dict[str, str] = {}
    if now is not None and now.gone and set(names) == prev.names:
        return out
    for column, attnum in sorted(prev.attnums.items()):
        if column not in prev.covered:
            continue
        if numbered is not None:
            name = {a: n for n, a in numbered.items()}.get(attnum)
            if name is not None and name not in covered:
                out[column] = f"column {attnum} is now named {name}"
            continue
        if now is None:
            continue
        name = now.name_of.get(attnum)
        if name is not None and name in names:
            if name not in covered:
                out[column] = f"column {attnum} is now named {name}"
        elif now.stale:
            # The catalog is ahead of the stream: the column may be any name shown here
            # that the catalog no longer has.
            gone = [n for n in names if n not in now.number_of]
            out[column] = (
                f"column {attnum} is {'gone' if name is None else f'named {name}'} in the"
                f" catalog now, which no longer has {', '.join(gone[:5])} of this shape:"
                " it may be one of them"
            )
    return out


def _lost_columns(
    prev: _Seen, covered: dict[str, str], names: Sequence[str], session: int, lsn: int | None
) -> list[str]:
    """The columns of ``prev`` whose data may go out uncovered in the new shape."""
    if prev.session == session:
        earlier = True
    elif lsn is None or prev.lsn is None:
        return []  # no order between them is known
    else:
        # The catalog read does not hold a transaction committed at or after its lsn; a
        # session's shape was seen in the transaction committed at its lsn.
        earlier = lsn >= prev.lsn if prev.session is None else lsn > prev.lsn
    # A covered column missing by name became one of the columns new to this shape, or
    # (earlier shape) was dropped — names cannot tell which, so a drop counts as a loss;
    # (later shape) was added since, when this shape has no column the later one lacks.
    extra = set(names) - prev.names
    extra_uncovered = any(n not in covered for n in extra)
    missing_lost = extra_uncovered or (earlier and not extra)
    return sorted(
        c
        for c in prev.covered
        # present: lost when the table's new name leaves it without a rule
        if (c not in covered if c in names else missing_lost)
    )


def _numbers(
    covered: dict[str, str],
    names: Sequence[str],
    numbered: dict[str, int] | None,
    now: _Catalog | None,
    prev: _Seen | None,
) -> dict[str, int]:
    """The attribute numbers of a new shape's covered columns: the message's (a DDL
    event); else, for a Relation message (names only), the catalog's when it shows this
    shape, those a covered number of the shape before it has under the same name now, or
    (no catalog to read) those of the same names in the shape before it."""
    if numbered is not None:
        return {n: numbered[n] for n in covered if n in numbered}
    if now is not None:
        if now.exact:
            return {n: now.number_of[n] for n in covered if n in now.number_of}
        kept = prev.attnums.values() if prev is not None else ()
        return {now.name_of[a]: a for a in kept if a in now.name_of and now.name_of[a] in covered}
    if prev is None:
        return {}
    return {n: prev.attnums[n] for n in covered if n in prev.attnums}


def _stops(
    prev: _Seen,
    lost: list[str],
    oid: int | None,
    schema: str,
    table: str,
    names: Sequence[str],
    covered: dict[str, str],
    numbered: dict[str, int] | None,
) -> list[Stop]:
    """What to record for ``lost``: each column by its attribute number where the last
    shape knew it (exact: a rename keeps it). Else by the names in the new shape that may
    hold its data — its own (the table was renamed) or every uncovered column new to the
    shape (names cannot tell which one it became) — numbered by the message if it can."""
    stops = []
    extra = [n for n in names if n not in prev.names and n not in covered]
    for column in lost:
        rule = prev.covered[column]
        if column in prev.attnums:
            stops.append(Stop(oid, prev.attnums[column], prev.schema, prev.table, column,
                              rule, schema, table))  # fmt: skip
            continue
        for name in [column] if column in names else extra:
            attnum = numbered.get(name) if numbered is not None else None
            stops.append(Stop(oid, attnum, prev.schema, prev.table, column, rule, schema,
                              table, name))  # fmt: skip
    return stops


def _lost(
    prev: _Seen,
    lost: list[str],
    schema: str,
    table: str,
    names: Sequence[str],
    where: str,
    notes: dict[str, str],
) -> PermanentError:
    def one(c: str) -> str:
        note = f": {notes[c]}" if c in notes else ""
        return f"{prev.schema}.{prev.table}.{c} (rule {prev.covered[c]!r}{note})"

    was = ", ".join(one(c) for c in lost)
    shown = ", ".join(names[:50]) + (" ..." if len(names) > 50 else "")
    return PermanentError(
        f"transform rules covered {was}; {where} shows the table as {schema}.{table} with"
        f" columns ({shown}), where no rule covers that data: the column or the table was"
        " renamed or moved to another schema (another column may have taken the old"
        " name), or the column dropped. Stopped before anything of the table in this"
        " shape was sent",
        hint="change transforms.rules to the new names (or remove the rule of a dropped"
        " column), then restart: pg2kafka resumes at this change. If it has to send"
        " changes from before the rename again, a rule must cover both names until it is"
        " past them (a wildcard, e.g. schema.table.*email)",
    )
