"""The bulk path for rows new to the target: a snapshot's ``read`` rows, a load's
inserts — COPYed straight into the table, their versions COPYed beside them.

:mod:`.statements` applies any batch, but every row is read out of JSON by the server,
looked up twice and written through a chain of CTEs (~30k rows/s). A batch whose rows of
one table are all *new* — ``read`` or ``insert``, whole (no unchanged TOAST), above the
table's floor — usually meets neither a target row nor a recorded version for its keys.
Then:

1. the rows are COPYed into the target table (text format, the values as the event
   carried them: the type's input reads them);
2. their versions are added to ``_walcast_target.rows``, keyed by the text
   :func:`.statements.apply_sql` computes on the server (``ROW(k)::text``): COPYed when
   that text was computed with the rows (see *Versions*), else inserted by one statement
   that computes it.

Both are plain inserts: a key the target already holds — a row, or a version (a deleted
row's included) — fails the statement with a unique violation, and the batch goes the
guarded way instead (the caller rolls its savepoint back). So
the bulk path never decides a version question: it only runs where there is none.

Values (the rules live in the compiled part, ``native/src/copy.rs``, and only there): a
value goes as the text its type's input reads — a string unescaped, a number as written,
json / jsonb as the exact text the event embeds, bytea from its base64; dates and times
unless a year is in ISO's expanded form (``time_text`` in the V001 migration converts
those, so such a row sends its batch the guarded way). A table with an array column
always goes the guarded way (``array_text``). The rows of a batch are encoded in one call
that releases the GIL, so the consumer loop decodes the next records meanwhile.

Versions: when every key column is an integer, text, varchar or uuid, the key's text as
``_walcast_target.rows`` holds it (``ROW(k)::text``, quoted as Postgres' ``record_out``
quotes) is computed with the rows, and the versions are COPYed too; otherwise — another
key type, or a text key with a non-ASCII character, whose quoting follows the server's
locale — one ``INSERT`` computes them from the keys. A key text computed here that
differed from the server's would hold a second version for one row: the rules are the
crate's unit tests, and ``tests/integration/kafka2postgres/test_bulk.py`` has later
changes find every version the bulk path recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import Connection, sql

from services.kafka2postgres._native import copy_rows
from services.kafka2postgres.batch import Change
from services.kafka2postgres.schema import TableSchema
from services.kafka2postgres.statements import ROWS, target_name, value_sql

MIN_ROWS = 64
"""Smaller batches go the guarded way: the bulk path's two statements would not pay."""

_KINDS = frozenset("sifbjxdtz")


class NotPlain(Exception):  # noqa: N818 - a signal inside this module, never raised out
    """A value the bulk path cannot send as it is: the batch goes the guarded way."""


@dataclass(frozen=True)
class Encoded:
    """One batch's rows, ready to send (:meth:`CopyPlan.encode`)."""

    rows: bytes  # COPY text of the table's rows
    versions: bytes | None  # COPY text of their versions, when the key's text was computed
    params: dict[str, Any]  # otherwise: the versions statement's parameters


@dataclass(frozen=True)
class CopyPlan:
    """How one table's new rows are copied in (:func:`plan`)."""

    columns: tuple[tuple[str, str], ...]  # (name, kind) in the table's order
    key_at: tuple[int, ...]  # the key columns' positions in ``columns``
    key_types: tuple[str, ...]  # their pg_type names
    copy: sql.Composed
    copy_versions: sql.Composed
    versions: sql.Composed  # the INSERT, when the key's text is the server's to compute

    def encode(self, changes: Sequence[Change], tbl: int) -> Encoded:
        """The COPY text of ``changes`` and of their versions; :class:`NotPlain` when a
        value needs converting (nothing sent yet)."""
        try:
            rows, versions, keys = copy_rows(
                [c.row for c in changes], list(self.columns), list(self.key_at),
                list(self.key_types), tbl, [c.version for c in changes],
                [c.hash for c in changes], [c.xid for c in changes],
            )  # fmt: skip
        except ValueError as exc:
            raise NotPlain(str(exc)) from None
        params: dict[str, Any] = {}
        if versions is None:
            params = {f"k{i}": k.decode() for i, k in enumerate(keys)}
            params["v"] = "{" + ",".join(str(c.version) for c in changes) + "}"
            params["h"] = (
                "{" + ",".join("NULL" if c.hash is None else str(c.hash) for c in changes) + "}"
            )
            params["x"] = "{" + ",".join(str(c.xid) for c in changes) + "}"
            params["tbl"] = tbl
        return Encoded(rows, versions, params)


def plan(schema_name: str, table: str, schema: TableSchema) -> CopyPlan | None:
    """The bulk path for this table, or None when a column's values always need
    converting (an array) or its key cannot take it (none, or a json one)."""
    if any(c.is_array or c.kind not in _KINDS for c in schema.columns):
        return None
    names = tuple(schema.names)
    key_cols = [schema.column(k) for k in schema.key]
    if not key_cols or any(c.kind == "j" for c in key_cols):
        return None
    copy = sql.SQL("COPY {} ({}) FROM STDIN").format(
        target_name(schema_name, table), sql.SQL(", ").join(sql.Identifier(n) for n in names)
    )
    copy_versions = sql.SQL(
        "COPY {rows} (tbl, key, version, deleted, unfilled, hash, xid) FROM STDIN"
    ).format(rows=ROWS)
    slots = [sql.Identifier(f"k{i}") for i in range(len(key_cols))]
    key = sql.SQL("ROW({})::text").format(
        sql.SQL(", ").join(
            value_sql(c, sql.SQL("u.{}").format(s)) for c, s in zip(key_cols, slots, strict=True)
        )
    )
    arrays = sql.SQL(", ").join(
        [
            sql.SQL("json_array_elements_text({}::json)").format(sql.Placeholder(f"k{i}"))
            for i in range(len(key_cols))
        ]
        + [sql.SQL(f"unnest(%({a})s::bigint[])") for a in "vhx"]
    )
    versions = sql.SQL(
        "INSERT INTO {rows} (tbl, key, version, deleted, hash, xid, at)"
        " SELECT %(tbl)s, {key}, u.v, false, u.h, u.x, now()"
        " FROM ROWS FROM ({arrays}) AS u({slots}, v, h, x)"
    ).format(rows=ROWS, key=key, arrays=arrays, slots=sql.SQL(", ").join(slots))
    return CopyPlan(
        tuple((c.name, c.kind) for c in schema.columns),
        tuple(names.index(k) for k in schema.key),
        tuple(c.type for c in key_cols),
        copy,
        copy_versions,
        versions,
    )


def copy_in(conn: Connection[Any], p: CopyPlan, changes: list[Change], tbl: int) -> int:
    """COPY ``changes`` (all new: see the module) into the table and record their
    versions; :class:`NotPlain` when a value needs converting (nothing sent yet). A key
    the target holds fails it with ``UniqueViolation`` (the caller's savepoint undoes it)."""
    e = p.encode(changes, tbl)
    with conn.cursor() as cur:
        with cur.copy(p.copy) as cp:
            cp.write(e.rows)
        if e.versions is not None:
            with cur.copy(p.copy_versions) as cp:
                cp.write(e.versions)
        else:
            cur.execute(p.versions, e.params)
    return len(changes)
