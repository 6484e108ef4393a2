"""The target tables kafka2postgres writes, and their schema changes.

Each source table has one row in ``_walcast_target.tables`` (sql/kafka2postgres/V001):
where it goes, whether walcast created it, its floor (changes at or below it are kept
out: its last truncate, snapshot end or creation), the version of the schema change last
applied (``schema_at``: under primary-key partitioning each partition carries a copy, and
an older copy met after a newer one is skipped), its columns with their numbers, and the
renames and drops that rows older than them still need (:mod:`shared.contract.moves`).

A table's schema changes are applied from the DDL event's resulting schema
(:mod:`services.kafka2postgres.schema`), by column number: renames, added and dropped
columns, type changes Postgres can make (``USING col::type``), a new key. Only a table
walcast created is altered or dropped; one it found in the target is written only with
``target.adopt_tables`` and never altered. A table whose change cannot be applied is
stopped with the reason (:meth:`Tables.stop`), the others go on.

Every method runs inside the caller's transaction on the caller's connection: a change
and the bookkeeping that records it commit together.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
from psycopg import sql

from services.kafka2postgres.copying import CopyPlan, plan
from services.kafka2postgres.schema import ROW_ID, Column, SchemaError, TableSchema, quote_ident
from services.kafka2postgres.settings import TargetSettings
from services.kafka2postgres.statements import ROWS, TABLES, apply_sql, key_text, target_name
from shared.contract.ddl import renames as ddl_renames
from shared.contract.event import EventView
from shared.contract.moves import Moves, record
from shared.errors import TableStoppedError

log = logging.getLogger(__name__)

Source = tuple[str, str, str]  # db, schema, table
_LOCK_NS = 0x6B327067  # "k2pg": the advisory lock namespace of target tables


@dataclass
class TargetTable:
    id: int
    source: Source
    schema_name: str
    name: str
    created: bool
    floor: int
    schema_at: int
    schema: TableSchema
    moves: Moves
    stopped: str | None
    _apply: sql.Composed | None = field(default=None, repr=False)
    _copy: tuple[CopyPlan | None] | None = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        return f"{self.schema_name}.{self.name}"

    @property
    def qualified(self) -> sql.Composed:
        return target_name(self.schema_name, self.name)

    def apply_statement(self) -> sql.Composed:
        if self._apply is None:
            self._apply = apply_sql(self.schema_name, self.name, self.schema)
        return self._apply

    def copy_plan(self) -> CopyPlan | None:
        """The bulk path for new rows (:mod:`.copying`), None where it does not apply."""
        if self._copy is None:
            self._copy = (plan(self.schema_name, self.name, self.schema),)
        return self._copy[0]

    def set_schema(self, schema: TableSchema) -> None:
        self.schema = schema
        self._apply = None
        self._copy = None


def source_of(ev: EventView) -> Source:
    return (str(ev.db), str(ev.schema), str(ev.table))


class Tables:
    """The target tables, cached from ``_walcast_target.tables``. Several writers may
    write one table (members of the group reading its partitions, a ``replay``): each
    write and table-wide event first :meth:`claim` s the table — an advisory lock held to
    the end of its transaction — and reads its bookkeeping again."""

    def __init__(self, settings: TargetSettings) -> None:
        self.s = settings
        self.by_source: dict[Source, TargetTable] = {}
        self.lock = threading.Lock()  # add() reads on the loop's thread while a write creates

    # -- reading ---------------------------------------------------------------------------

    _SELECT = (
        "SELECT id, source_db, source_schema, source_table, target_schema, target_table,"
        " created_by_walcast, floor, schema_at, columns, key, exact, moves, stopped FROM {}"
    )

    @staticmethod
    def _entry(r: Any) -> TargetTable:
        schema = TableSchema.from_json(r[9], list(r[10]), bool(r[11]))
        return TargetTable(
            id=r[0], source=(r[1], r[2], r[3]), schema_name=r[4], name=r[5],
            created=r[6], floor=r[7], schema_at=r[8], schema=schema,
            moves=Moves.of({"moves": r[12]}), stopped=r[13],
        )  # fmt: skip

    def load(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(sql.SQL(self._SELECT).format(TABLES)).fetchall()
        loaded = {t.source: t for t in map(self._entry, rows)}
        with self.lock:
            self.by_source = loaded  # one assignment: a reader sees the old or the new

    def claim(self, conn: psycopg.Connection[Any], source: Source) -> TargetTable | None:
        """Serialise writers of ``source``'s table until the caller's transaction ends
        (members of one consumer group write one table from several partitions, and
        ``replay`` beside ``run``), then read its bookkeeping as the last of them left
        it: its schema, floor and whether it was stopped or resumed."""
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [_LOCK_NS, "\x1f".join(source)]
        )
        row = conn.execute(
            sql.SQL(self._SELECT + " WHERE source_db = %s AND source_schema = %s"
                    " AND source_table = %s").format(TABLES),
            list(source),
        ).fetchone()  # fmt: skip
        held = self.by_source.get(source)
        if row is None:
            if held is not None:
                with self.lock:
                    self.by_source.pop(source, None)
            return None
        fresh = self._entry(row)
        if held is not None and (held.schema_at, held.floor, held.stopped, held.id) == (
            fresh.schema_at,
            fresh.floor,
            fresh.stopped,
            fresh.id,
        ):
            return held  # unchanged: keep the cached statement
        with self.lock:
            self.by_source[source] = fresh
        return fresh

    def get(self, source: Source) -> TargetTable | None:
        return self.by_source.get(source)

    def target_of(self, source: Source) -> tuple[str, str]:
        db, schema, table = source
        return (
            self.s.schema_template.format(db=db, schema=schema, table=table),
            self.s.table_template.format(db=db, schema=schema, table=table),
        )

    # -- writing ---------------------------------------------------------------------------

    def save(self, conn: psycopg.Connection[Any], t: TargetTable) -> None:
        moves = [[old, new, at] for old, new, at in t.moves.items]
        conn.execute(
            sql.SQL(
                "UPDATE {} SET floor = %s, schema_at = %s, columns = %s, key = %s, exact = %s,"
                " moves = %s, stopped = %s,"
                " stopped_at = CASE WHEN %s::text IS NULL THEN NULL ELSE now() END WHERE id = %s"
            ).format(TABLES),
            [t.floor, t.schema_at, orjson.dumps(t.schema.as_json()).decode(), list(t.schema.key),
             t.schema.exact, orjson.dumps(moves).decode(), t.stopped, t.stopped, t.id],
        )  # fmt: skip

    def ensure(
        self, conn: psycopg.Connection[Any], source: Source, schema: TableSchema, version: int
    ) -> TargetTable:
        """The target table of ``source``, made from ``schema`` when walcast has none
        (``version``: the floor of a table made by its CREATE TABLE; -1 otherwise).
        Raises :class:`TableStoppedError` for a table found in the target without
        ``target.adopt_tables``, or a schema that cannot be created."""
        held = self.by_source.get(source)
        if held is not None:
            return held
        schema_name, name = self.target_of(source)
        if not schema.key:
            raise TableStoppedError(
                f"{source[1]}.{source[2]} has no primary key: kafka2postgres writes tables"
                " by their key (insert-only ones by their rows' ids)"
            )
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL",
            [f"{quote_ident(schema_name)}.{quote_ident(name)}"],
        ).fetchone()
        created = not (exists and exists[0])
        schema = self.resolved(conn, schema, schema_name, source[1])
        if not created and not self.s.adopt_tables:
            raise TableStoppedError(
                f"the target table {schema_name}.{name} exists and walcast did not create it:"
                " set target.adopt_tables to write into it (its columns and key must be the"
                " source's), or drop or rename it, then run `kafka2postgres resume`"
            )
        if created:
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema_name))
            )
            conn.execute(create_sql(schema_name, name, schema, self.s.fillfactor))
            log.info("created %s.%s for %s.%s", schema_name, name, source[1], source[2])
        row = conn.execute(
            sql.SQL(
                "INSERT INTO {} (source_db, source_schema, source_table, target_schema,"
                " target_table, created_by_walcast, floor) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                " RETURNING id"
            ).format(TABLES),
            [*source, schema_name, name, created, version],
        ).fetchone()
        assert row is not None
        t = TargetTable(
            id=row[0], source=source, schema_name=schema_name, name=name, created=created,
            floor=version, schema_at=-1, schema=schema, moves=Moves((), 0), stopped=None,
        )  # fmt: skip
        self.save(conn, t)
        with self.lock:
            self.by_source[source] = t
        return t

    def forget(self, source: Source) -> None:
        """Drop the cached entry (its transaction rolled back: it was never made)."""
        with self.lock:
            self.by_source.pop(source, None)

    def resolved(
        self,
        conn: psycopg.Connection[Any],
        schema: TableSchema,
        target_schema: str,
        source_schema: str,
    ) -> TableSchema:
        """``schema`` with each column's type found in the target: a built-in or
        qualified type as it is; a type of the source's own (an enum, a domain) in the
        target schema, the source's schema name or ``public``. A type found nowhere
        stops the table: the operator creates it in the target first."""
        out = []
        for c in schema.columns:
            if self._type_exists(conn, c.sql_type):
                out.append(c)
                continue
            base = c.sql_type.removesuffix("[]" * c.sql_type.count("[]"))
            arrays = c.sql_type[len(base) :]
            for where in dict.fromkeys((target_schema, source_schema, "public")):
                candidate = f"{quote_ident(where)}.{base}"
                if self._type_exists(conn, candidate):
                    out.append(Column(c.name, c.type, candidate + arrays, c.num))
                    break
            else:
                raise TableStoppedError(
                    f"column {c.name!r} is of type {c.sql_type}, which the target database does"
                    f" not have: create it there (in schema {target_schema} or public, as in the"
                    " source), then run `kafka2postgres resume`"
                )
        return TableSchema(tuple(out), schema.key, schema.exact)

    @staticmethod
    def _type_exists(conn: psycopg.Connection[Any], name: str) -> bool:
        try:
            with conn.transaction():  # a savepoint: to_regtype raises on some malformed names
                row = conn.execute("SELECT to_regtype(%s) IS NOT NULL", [name]).fetchone()
        except psycopg.errors.DataError:
            return False
        return bool(row and row[0])

    def widen(self, conn: psycopg.Connection[Any], t: TargetTable, types: dict[str, str]) -> None:
        """Add the columns a row carries that the target table lacks (a source without
        DDL capture announces none)."""
        wider = t.schema.with_columns(types)
        if wider is t.schema:
            return
        if not t.created:
            raise TableStoppedError(
                f"rows of {t.source[1]}.{t.source[2]} carry columns"
                f" {[n for n in wider.names if n not in t.schema.names]} that {t.shown} lacks,"
                " and walcast did not create it: add them, then run `kafka2postgres resume`"
            )
        wider = self.resolved(conn, wider, t.schema_name, t.source[1])
        for c in wider.columns[len(t.schema.columns) :]:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    t.qualified, sql.Identifier(c.name), sql.SQL(c.sql_type)
                )
            )
            log.info("column %s added to %s (seen in a row)", c.name, t.shown)
        t.set_schema(wider)
        self.save(conn, t)

    def stop(self, conn: psycopg.Connection[Any], t: TargetTable, reason: str) -> None:
        t.stopped = reason
        self.save(conn, t)
        log.error("table %s stopped: %s", t.shown, reason)

    # -- schema changes --------------------------------------------------------------------

    def ddl(self, conn: psycopg.Connection[Any], ev: EventView) -> str:
        """Apply a DDL event; returns what was done, for the log."""
        source = source_of(ev)
        d = ev.ddl
        version = ev.version()
        held = self.by_source.get(source)
        if held is not None and version <= held.schema_at:
            return f"skipped: {held.shown} is at version {held.schema_at} already"
        if held is not None and held.stopped:
            return f"skipped: {held.shown} is stopped ({held.stopped})"
        if d.get("dropped"):
            return self._drop(conn, held, version)
        if not isinstance(d.get("columns"), list):
            return "no resulting schema: nothing to apply"
        try:
            new = TableSchema.from_ddl(d)
        except SchemaError as exc:
            raise TableStoppedError(str(exc)) from None
        tag = str(d.get("tag", "")).upper()
        if held is not None and tag == "CREATE TABLE" and version > held.floor:
            if not held.created:
                raise TableStoppedError(
                    f"{source[1]}.{source[2]} was created again in the source; walcast did"
                    f" not create {held.shown} and leaves it as it is: empty or drop it, then"
                    " run `kafka2postgres resume`"
                )
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(held.qualified))
            self._forget(conn, held)
            with self.lock:
                del self.by_source[source]
            held = None
        if held is None and not new.key:
            return "no primary key (yet): the table is made when it gains one"
        if held is None:
            t = self.ensure(conn, source, new, version if tag == "CREATE TABLE" else -1)
            t.schema_at = version
            self.save(conn, t)
            return f"{t.shown} made"
        if held.schema.appended:
            if not new.key:
                new = new.with_row_id()  # still insert-only: the row id stays its key
            else:
                self._keyed_now(conn, held)
        if not new.key:
            raise TableStoppedError(
                f"{source[1]}.{source[2]} lost its primary key: kafka2postgres writes tables"
                " by their key; give it one again, then run `kafka2postgres resume`"
            )
        done = self._alter(conn, held, new, str(d.get("statement") or ""), version)
        held.schema_at = version
        self.save(conn, held)
        return done

    def described(self, conn: psycopg.Connection[Any], ev: EventView) -> str:
        """A snapshot's start marker carrying the table's schema (pg2kafka's: ``columns``,
        ``primary_key``, as a DDL event's; a malformed one is ignored, said in the log).
        A table not held yet is made with it — the source's types exactly, though no DDL
        event described it; one its rows made first (types without their length or
        precision) gets the exact types when its columns and key are the same. Anything
        else is the DDL events' to change. Returns what was done, for the log."""
        source = source_of(ev)
        info = ev.snapshot
        try:
            new = TableSchema.from_ddl(
                {"columns": info.get("columns"), "primary_key": info.get("primary_key")}
            )
        except SchemaError as exc:
            # not needed to apply anything: the rows make the table as without it
            log.warning("the schema of %s.%s's snapshot marker is ignored: %s", source[1],
                        source[2], exc)  # fmt: skip
            return "its schema ignored (malformed)"
        held = self.by_source.get(source)
        version = ev.version()
        if not new.key:
            return "no key: an insert-only table is made from its rows"
        if held is None:
            t = self.ensure(conn, source, new, -1)
            t.schema_at = version - 1
            self.save(conn, t)
            return f"{t.shown} made from the snapshot's schema"
        same = held.schema.names == new.names and held.schema.key == new.key
        if held.stopped or held.schema.exact or not held.created or not same:
            return f"{held.shown} kept as it is"
        if version - 1 <= held.schema_at:
            return f"{held.shown} is at a later schema already"
        done = self._alter(conn, held, new, "", version - 1)
        held.schema_at = version - 1
        self.save(conn, held)
        return done

    def _keyed_now(self, conn: psycopg.Connection[Any], held: TargetTable) -> None:
        """An insert-only table that gained a key: its rows, held by row id, cannot be
        matched with the keyed ones to come, so they go, with :data:`ROW_ID` and the
        versions held. pg2kafka reads a table that gains a key again (an incremental
        snapshot), which brings every row back under its key."""
        if not held.created:
            raise TableStoppedError(
                f"{held.source[1]}.{held.source[2]} gained a primary key and walcast did not"
                f" create {held.shown}: alter it to match, then run `kafka2postgres resume`"
            )
        conn.execute(sql.SQL("DELETE FROM {}").format(held.qualified))
        conn.execute(sql.SQL("DELETE FROM {} WHERE tbl = %s").format(ROWS), [held.id])
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(held.qualified, sql.Identifier(ROW_ID))
        )
        held.set_schema(held.schema.without_row_id())
        log.info("%s gained a key: its insert-only rows removed until the snapshot of it"
                 " brings them back keyed", held.shown)  # fmt: skip

    def _forget(self, conn: psycopg.Connection[Any], held: TargetTable) -> None:
        """Remove a dropped table's bookkeeping: its row versions, then its entry."""
        conn.execute(sql.SQL("DELETE FROM {} WHERE tbl = %s").format(ROWS), [held.id])
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(TABLES), [held.id])

    def _drop(self, conn: psycopg.Connection[Any], held: TargetTable | None, version: int) -> str:
        if held is None:
            return "a table walcast never wrote: nothing to drop"
        if self.s.on_drop_table == "apply" and held.created:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(held.qualified))
            self._forget(conn, held)
            with self.lock:
                self.by_source.pop(held.source, None)
            return f"{held.shown} dropped"
        held.schema_at = version
        self.save(conn, held)
        why = "target.on_drop_table" if held.created else "walcast did not create it"
        return f"{held.shown} kept ({why})"

    def _alter(
        self, conn: psycopg.Connection[Any], t: TargetTable, new: TableSchema, statement: str,
        version: int,
    ) -> str:  # fmt: skip
        old = t.schema
        new = self.resolved(conn, new, t.schema_name, t.source[1])
        removed = [n for n in old.names if n not in new.names]
        added = [n for n in new.names if n not in old.names]
        renames = ddl_renames(removed, added, old.numbers(), new.numbers(), statement)
        for o, n in renames:
            removed.remove(o)
            added.remove(n)
        renamed = dict(renames)
        held_types = self._column_types(conn, t)
        changed_types = [
            c for c in new.columns
            if new.exact and c.name not in added
            and held_types.get(next((o for o, n in renames if n == c.name), c.name)) != c.sql_type
        ]  # fmt: skip
        new_key = new.key != tuple(renamed.get(k, k) for k in old.key)
        if not (removed or added or renames or changed_types or new_key):
            t.set_schema(new)
            return f"{t.shown}: no change to apply"
        if not t.created:
            raise TableStoppedError(
                f"the schema of {t.source[1]}.{t.source[2]} changed ({statement[:200]!r}) and"
                f" walcast did not create {t.shown}: alter it to match, then run"
                " `kafka2postgres resume`"
            )
        q = t.qualified
        steps: list[str] = []
        for o, n in renames:
            conn.execute(
                sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(
                    q, sql.Identifier(o), sql.Identifier(n)
                )
            )
            steps.append(f"renamed {o} to {n}")
        for name in added:
            c = new.column(name)
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    q, sql.Identifier(name), sql.SQL(c.sql_type)
                )
            )
            steps.append(f"added {name} {c.sql_type}")
        if new_key:
            self._rekey(conn, t, tuple(renamed.get(k, k) for k in old.key), new.key)
            steps.append(f"key ({', '.join(new.key)})")
        for name in removed:
            conn.execute(
                sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS {}").format(q, sql.Identifier(name))
            )
            steps.append(f"dropped {name}")
        for c in changed_types:
            conn.execute(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}::{}").format(
                    q, sql.Identifier(c.name), sql.SQL(c.sql_type), sql.Identifier(c.name),
                    sql.SQL(c.sql_type),
                )
            )  # fmt: skip
            steps.append(f"{c.name} now {c.sql_type}")
        if renames or removed:
            meta: dict[str, Any] = {"moves": [[o, n, at] for o, n, at in t.moves.items]}
            record(meta, renames, removed, version)
            t.moves = Moves.of(meta)
        t.set_schema(new)
        return f"{t.shown}: " + "; ".join(steps)

    @staticmethod
    def _column_types(conn: psycopg.Connection[Any], t: TargetTable) -> dict[str, str]:
        """The target table's columns and their types as ``format_type`` writes them —
        as a DDL event's ``sql_type`` does: a type only changes where they differ."""
        rows = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            [f"{quote_ident(t.schema_name)}.{quote_ident(t.name)}"],
        ).fetchall()
        return {str(n): str(ty) for n, ty in rows}

    def _rekey(
        self,
        conn: psycopg.Connection[Any],
        t: TargetTable,
        old: tuple[str, ...],
        new: tuple[str, ...],
    ) -> None:
        """A new primary key: the versions held move to the rows' new key text; a deleted
        row's version (no row left to read its new key from) is forgotten."""
        q = t.qualified
        row = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
            [f"{quote_ident(t.schema_name)}.{quote_ident(t.name)}"],
        ).fetchone()
        if row is not None:
            conn.execute(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(q, sql.Identifier(row[0]))
            )
        if old and new:
            conn.execute(
                sql.SQL('DELETE FROM "_walcast_target"."rows" WHERE tbl = %s AND deleted'),
                [t.id],
            )
            conn.execute(
                sql.SQL(
                    'UPDATE "_walcast_target"."rows" AS s SET key = {new} FROM {q} AS t'
                    " WHERE s.tbl = %s AND s.key = {old}"
                ).format(new=key_text("t", new), q=q, old=key_text("t", old)),
                [t.id],
            )
        if new:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD PRIMARY KEY ({})").format(
                    q, sql.SQL(", ").join(sql.Identifier(k) for k in new)
                )
            )


def create_sql(
    schema_name: str, name: str, schema: TableSchema, fillfactor: int = 100
) -> sql.Composed:
    """``CREATE TABLE`` with the source's columns and key (and ``fillfactor``:
    ``target.fillfactor``). Columns other than the key are nullable whatever the source
    says: a partial row (an unchanged TOAST value the target does not hold yet) is
    written with the value missing until an older row fills it."""
    cols = [
        sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.sql_type)) for c in schema.columns
    ]
    cols.append(
        sql.SQL("PRIMARY KEY ({})").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in schema.key)
        )
    )
    return sql.SQL("CREATE TABLE {} ({}) WITH (fillfactor = {})").format(
        target_name(schema_name, name), sql.SQL(", ").join(cols), sql.Literal(int(fillfactor))
    )
