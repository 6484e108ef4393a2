"""Stops for columns that lost their transform rule, kept in ``_walcast.transform_stops``.

When a covered column reaches the stream under a name no rule covers, the stream stops
before anything of that shape is sent (services/pg2kafka/transform_shapes.py). The stop
alone does not survive a restart: pgoutput sends a relation's shape once per session,
before its first change, and the catalog read at the next start already shows the new
name — with a rule that still matches something in the table (``app.users.*mail*`` and a
second column ``mailing_opt``) the restart would stream the renamed column in the clear.
So the stop is recorded (:func:`record`, V016) by slot, table oid and attribute number —
what a rename does not change — and every start, and every session's first shape, first
resolves the slot's records (:func:`resolve`): a column gone, or covered again under its
current name, has its record deleted; one that exists, is streamed and is covered by no
rule refuses the start with its old and new names. An operator who wants the column in
the clear removes the record (:func:`clear_statement`, documented in docs/pg2kafka.md).

Both run on ordinary connections of pg2kafka's role (the owner that ran ``init``), with
every name qualified.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from services.pg2kafka.filters import TableFilter
from services.pg2kafka.transform_shapes import Stop
from shared.errors import PermanentError

log = logging.getLogger(__name__)

TABLE = "_walcast.transform_stops"

_INSERT_SQL = """
INSERT INTO "_walcast"."transform_stops"
       ("slot", "table_oid", "attnum", "schema_name", "table_name", "column_name", "rule")
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT ("slot", "table_oid", "attnum") DO NOTHING
"""

# The table by its name in the stopping shape (a message without the table's oid), and a
# column by its name there (a shape without attribute numbers): what the catalog says now.
_TABLE_SQL = "SELECT pg_catalog.to_regclass(%s)::oid::int8"
_ATTNUM_SQL = """
SELECT a.attnum FROM pg_catalog.pg_attribute a
 WHERE a.attrelid = %s::oid AND a.attname = %s AND a.attnum > 0 AND NOT a.attisdropped
"""

# A table's columns now, for a Relation message's shape (names only): by oid, so a name
# another column took over (RENAME email TO email_old; ADD COLUMN email) is told apart.
_COLUMNS_SQL = """
SELECT a.attnum::int4, a.attname::text, a.attgenerated <> ''
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_attribute a
    ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.oid = %s::pg_catalog.oid
 ORDER BY a.attnum
"""
_EXISTS_SQL = "SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = %s::pg_catalog.oid"

_RECORDS_SQL = """
SELECT s.table_oid::int8, s.attnum, s.schema_name, s.table_name, s.column_name, s.rule,
       s.stopped_at::text, n.nspname, c.relname, a.attname
  FROM "_walcast"."transform_stops" s
  LEFT JOIN pg_catalog.pg_class c ON c.oid = s.table_oid AND c.relkind IN ('r', 'p')
  LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_catalog.pg_attribute a
         ON a.attrelid = c.oid AND a.attnum = s.attnum AND NOT a.attisdropped
 WHERE s.slot = %s
 ORDER BY 1, 2
"""

_DELETE_SQL = """
DELETE FROM "_walcast"."transform_stops" WHERE "slot" = %s AND "table_oid" = %s AND "attnum" = %s
"""


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def exists(conn: psycopg.Connection[Any]) -> None:
    """PermanentError unless V016 created the table (a database initialised by an older
    pg2kafka): without it a stop could not outlive the process."""
    row = conn.execute("SELECT pg_catalog.to_regclass(%s)", [TABLE]).fetchone()
    if row is None or row[0] is None:
        raise PermanentError(
            f"{TABLE} does not exist: the database's walcast objects are older than this"
            " pg2kafka, which records there the columns that lost their transform rule",
            hint="run pg2kafka init (it applies the missing migrations), then start again",
        )


def record(conninfo: str, slot: str, stops: Iterable[Stop]) -> None:
    """Called by the shape check before it raises its stop: each column of ``stops`` is
    recorded for ``slot`` (an existing record of the column is kept: it holds the names
    the rule covered first). A stop whose table or column the catalog cannot name any more
    (no oid or attribute number in the message, renamed again since) is logged as not
    recorded. A failure to write raises (psycopg's error): the stream then stops without
    passing the change, and tries again."""
    with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
        for stop in stops:
            oid, attnum = stop.oid, stop.attnum
            now = f"{stop.now_schema}.{stop.now_table}"
            if oid is None:
                row = conn.execute(
                    _TABLE_SQL, [f"{_quoted(stop.now_schema)}.{_quoted(stop.now_table)}"]
                ).fetchone()
                oid = int(row[0]) if row is not None and row[0] is not None else None
            if oid is not None and attnum is None and stop.now_column is not None:
                row = conn.execute(_ATTNUM_SQL, [oid, stop.now_column]).fetchone()
                attnum = int(row[0]) if row is not None else None
            if oid is None or attnum is None:
                log.error(
                    "could not record that %s.%s.%s lost transform rule %r: the catalog no"
                    " longer has %s%s. Check that a rule covers its data before restarting",
                    stop.schema, stop.table, stop.column, stop.rule, now,
                    f".{stop.now_column}" if stop.now_column else "",
                )  # fmt: skip
                continue
            conn.execute(
                _INSERT_SQL,
                [slot, oid, attnum, stop.schema, stop.table, stop.column, stop.rule],
            )
            log.warning(
                "recorded that %s.%s.%s lost transform rule %r (table oid %d, column %d):"
                " pg2kafka refuses to start until a rule covers it",
                stop.schema, stop.table, stop.column, stop.rule, oid, attnum,
            )  # fmt: skip


def columns(conninfo: str, oid: int) -> list[tuple[int, str, bool]] | None:
    """Called by the shape check (:attr:`Shapes.catalog`) for a Relation message of a
    table with a covered column: the table's columns now — ``(attnum, name, generated)``
    in attribute order, dropped ones left out — or None when no table has the oid any
    more. A failure raises (psycopg's error): the stream stops without passing the
    message, and tries again."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        rows = conn.execute(_COLUMNS_SQL, [oid]).fetchall()
        if not rows and conn.execute(_EXISTS_SQL, [oid]).fetchone() is None:
            return None
    return [(int(n), str(name), bool(gen)) for n, name, gen in rows]


@dataclass(frozen=True, slots=True)
class Record:
    """A row of the table for the slot, with the column's names now (None: the table or
    the column is gone)."""

    oid: int
    attnum: int
    schema: str
    table: str
    column: str
    rule: str
    stopped_at: str
    now_schema: str | None
    now_table: str | None
    now_column: str | None


Verdict = Literal["delete", "keep", "refuse"]


def verdict(
    rec: Record, rule_for: Callable[[str, str, str], object | None], streamed: TableFilter
) -> Verdict:
    """What a record asks for now: ``delete`` when the column is gone (dropped, or its
    table) or a rule covers it under its current names (``rule_for`` finds one); ``keep``
    (nothing refused) when the filters do not stream its table — it is checked again at
    every start, should they come to; ``refuse`` when it is streamed and uncovered."""
    if rec.now_schema is None or rec.now_table is None or rec.now_column is None:
        return "delete"
    if not streamed.matches(rec.now_schema, rec.now_table):
        return "keep"
    if rule_for(rec.now_schema, rec.now_table, rec.now_column) is not None:
        return "delete"
    return "refuse"


def clear_statement(slot: str, rec: Record) -> str:
    """The SQL that removes the record: for an operator who wants the column in the clear."""
    return (
        f"DELETE FROM {TABLE} WHERE slot = {_literal(slot)}"
        f" AND table_oid = {rec.oid} AND attnum = {rec.attnum};"
    )


def refusal(slot: str, refused: list[Record]) -> PermanentError:
    def one(r: Record) -> str:
        return (
            f"{r.schema}.{r.table}.{r.column} (rule {r.rule!r}; stopped {r.stopped_at}) is"
            f" now {r.now_schema}.{r.now_table}.{r.now_column}"
        )

    shown = "; ".join(one(r) for r in refused[:10]) + (" ..." if len(refused) > 10 else "")
    deletes = " ".join(clear_statement(slot, r) for r in refused[:10])
    return PermanentError(
        f"a column lost its transform rule and no rule covers it under its current name:"
        f" {shown}. pg2kafka stopped there and will not stream it in the clear",
        hint="add or adjust a rule in transforms.rules that covers the new name, then"
        " restart (the record is then removed). To send the column in the clear on"
        f" purpose, remove the record as pg2kafka's role: {deletes}",
    )


def resolve(
    conninfo: str,
    slot: str,
    rule_for: Callable[[str, str, str], object | None],
    streamed: TableFilter,
) -> None:
    """At start-up (``check_database``) and before each session's first shape: the
    slot's records against the catalog and the rules (:func:`verdict`). Records that are
    settled are deleted; PermanentError naming every column still uncovered (old and new
    names, the rule, the ``DELETE`` that lets it through); PermanentError "run pg2kafka
    init" when the table is missing."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists(conn)
        try:
            rows = conn.execute(_RECORDS_SQL, [slot]).fetchall()
        except psycopg.errors.InsufficientPrivilege as exc:
            raise PermanentError(
                f"pg2kafka's role may not read {TABLE}, where a stream stopped for a column"
                " that lost its transform rule is recorded: with transform rules it does not"
                " start without knowing (fail closed)",
                hint="run pg2kafka as the role that ran `pg2kafka init`, or grant its role"
                f" USAGE on schema _walcast and SELECT, INSERT, DELETE on {TABLE}",
            ) from exc
        refused: list[Record] = []
        for row in rows:
            oid, attnum, schema, table, column, rule, at, now_s, now_t, now_c = row
            rec = Record(int(oid), int(attnum), str(schema), str(table), str(column),
                         str(rule), str(at), _text(now_s), _text(now_t), _text(now_c))  # fmt: skip
            decided = verdict(rec, rule_for, streamed)
            if decided == "refuse":
                refused.append(rec)
            elif decided == "delete":
                conn.execute(_DELETE_SQL, [slot, rec.oid, rec.attnum])
                log.info(
                    "the transform stop for %s.%s.%s is settled (%s): record removed",
                    rec.schema, rec.table, rec.column,
                    "gone" if rec.now_column is None
                    else f"covered as {rec.now_schema}.{rec.now_table}.{rec.now_column}",
                )  # fmt: skip
    if refused:
        raise refusal(slot, refused)
