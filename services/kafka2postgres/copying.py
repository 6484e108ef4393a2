"""The bulk path for rows new to the target: a snapshot's ``read`` rows, a load's
inserts — COPYed straight into the table, their versions recorded in one statement.

:mod:`.statements` applies any batch, but every row is read out of JSON by the server,
looked up twice and written through a chain of CTEs (~30k rows/s). A batch whose rows of
one table are all *new* — ``read`` or ``insert``, whole (no unchanged TOAST), above the
table's floor — usually meets neither a target row nor a recorded version for its keys.
Then:

1. the rows are COPYed into the target table (text format, the values as the event
   carried them: the type's input reads them);
2. their versions are inserted into ``_walcast_target.rows`` (``key`` computed by the
   server from the typed key, as :func:`.statements.apply_sql` computes it).

Both are plain inserts: a key the target already holds — a row, or a version (a deleted
row's included) — fails the statement with a unique violation, and the batch goes the
guarded way instead (:class:`Copier` says so; the caller rolls its savepoint back). So
the bulk path never decides a version question: it only runs where there is none.

Values: a column takes part when its values need no converting on the way back
(``shared/contract/pgtypes.py``: text, integers, floats, booleans; json / jsonb as the
exact text the event embeds; bytea from its base64; dates and times unless a year is in
ISO's expanded form — ``time_text`` in the V001 migration converts those, so such a row
sends its batch the guarded way). A table with an array column always goes the guarded
way (``array_text``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import msgspec
import orjson
from psycopg import Connection, sql

from services.kafka2postgres.batch import Change
from services.kafka2postgres.schema import Column, TableSchema
from services.kafka2postgres.statements import ROWS, target_name, value_sql

MIN_ROWS = 64
"""Smaller batches go the guarded way: the bulk path's two statements would not pay."""

_PLAIN = frozenset("sifb")
_TIME = frozenset("dtz")
_SCALARS = (str, int, float, bool)
_raw_row = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode


class NotPlain(Exception):  # noqa: N818 - a signal inside this module, never raised out
    """A value the bulk path cannot send as it is: the batch goes the guarded way."""


def _plain(value: Any) -> Any:
    if value is None or type(value) in _SCALARS:
        return value
    raise NotPlain


def _time(value: Any) -> Any:
    if value is None:
        return None
    if type(value) is not str or value[:1] in ("+", "-") or value.startswith("0000"):
        raise NotPlain  # an expanded year (or -infinity): time_text's work
    return value


def _bytea(value: Any) -> Any:
    if value is None:
        return None
    if type(value) is not str:
        raise NotPlain
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise NotPlain from None


def _converter(c: Column) -> Callable[[Any], Any] | None:
    if c.is_array:
        return None
    kind = c.kind
    if kind in _PLAIN:
        return _plain
    if kind in _TIME:
        return _time
    if kind == "x":
        return _bytea
    if kind == "j":
        return _json
    return None


def _json(value: Any) -> Any:
    """A json / jsonb value: the exact text the event embeds (rows are decoded with each
    value's JSON kept: :attr:`CopyPlan.raw`); JSON's null is SQL's NULL, as
    ``json_to_record`` reads it."""
    if value is None:
        return None
    text = bytes(value)
    return None if text == b"null" else text.decode()


@dataclass(frozen=True)
class CopyPlan:
    """How one table's new rows are copied in (:func:`plan`)."""

    names: tuple[str, ...]
    converters: tuple[Callable[[Any], Any], ...]
    key_at: tuple[int, ...]  # the key columns' positions in ``names``
    raw: bool  # a json column: rows decoded with each value's JSON text kept
    copy: sql.Composed
    versions: sql.Composed

    def rows(self, changes: Iterable[Change]) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
        """The COPY rows and the parameters of the versions statement; :class:`NotPlain`
        when a value needs converting."""
        names, convs, key_at = self.names, self.converters, self.key_at
        pick = itemgetter(*names) if len(names) > 1 else lambda r: (r[names[0]],)
        fast = all(c is _plain for c in convs)
        out: list[tuple[Any, ...]] = []
        keys: list[list[Any]] = [[] for _ in key_at]
        versions: list[int] = []
        hashes: list[int | None] = []
        xids: list[int] = []
        for ch in changes:
            if self.raw:
                raw = _raw_row(ch.row)
                values = tuple(
                    _from_raw(raw.get(n), conv) for n, conv in zip(names, convs, strict=True)
                )
                row = {
                    names[at]: orjson.loads(bytes(raw[names[at]]))
                    for at in key_at
                    if names[at] in raw
                }
            else:
                row = orjson.loads(ch.row)
                if fast and b"[" not in ch.row and ch.row.find(b"{", 1) < 0:
                    # every value a JSON scalar, no column to convert: picked at C speed
                    try:
                        values = pick(row)
                    except KeyError:  # a column the row lacks: NULL
                        values = tuple(row.get(n) for n in names)
                else:
                    values = tuple(conv(row.get(n)) for n, conv in zip(names, convs, strict=True))
            out.append(values)
            for slot, at in enumerate(key_at):
                keys[slot].append(row.get(names[at]))  # its JSON text is value_sql's input
            versions.append(ch.version)
            hashes.append(ch.hash)
            xids.append(ch.xid)
        # arrays as text (one join each; psycopg's list dumper is Python, per element)
        params: dict[str, Any] = {f"k{i}": orjson.dumps(k).decode() for i, k in enumerate(keys)}
        params["v"] = "{" + ",".join(map(str, versions)) + "}"
        params["h"] = "{" + ",".join("NULL" if h is None else str(h) for h in hashes) + "}"
        params["x"] = "{" + ",".join(map(str, xids)) + "}"
        return out, params


def _from_raw(raw: msgspec.Raw | None, conv: Callable[[Any], Any]) -> Any:
    if conv is _json:
        return _json(raw)
    return None if raw is None else conv(orjson.loads(bytes(raw)))


def plan(schema_name: str, table: str, schema: TableSchema) -> CopyPlan | None:
    """The bulk path for this table, or None when a column's values always need
    converting (an array)."""
    convs = []
    for c in schema.columns:
        conv = _converter(c)
        if conv is None:
            return None
        convs.append(conv)
    names = tuple(schema.names)
    key_cols = [schema.column(k) for k in schema.key]
    if not key_cols or any(c.kind == "j" for c in key_cols):
        return None
    raw = any(c.kind == "j" for c in schema.columns)
    copy = sql.SQL("COPY {} ({}) FROM STDIN").format(
        target_name(schema_name, table), sql.SQL(", ").join(sql.Identifier(n) for n in names)
    )
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
        names, tuple(convs), tuple(names.index(k) for k in schema.key), raw, copy, versions
    )


def copy_in(conn: Connection[Any], p: CopyPlan, changes: list[Change], tbl: int) -> int:
    """COPY ``changes`` (all new: see the module) into the table and record their
    versions; :class:`NotPlain` when a value needs converting (nothing sent yet). A key
    the target holds fails it with ``UniqueViolation`` (the caller's savepoint undoes it)."""
    rows, params = p.rows(changes)
    with conn.cursor() as cur:
        with cur.copy(p.copy) as cp:
            for r in rows:
                cp.write_row(r)
        cur.execute(p.versions, {**params, "tbl": tbl})
    return len(rows)
