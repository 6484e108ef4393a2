"""The statements kafka2postgres runs on a target table: set-based, one per table per
batch, never one per row.

**Apply** (:func:`apply_sql`). A batch's rows of one table travel as one JSON array
parameter, each element ``{"v": version, "d": delete?, "u": [unchanged TOAST columns],
"h": row hash, "x": xid, "r": <the row as the event carried it>}`` — the row's bytes are
never decoded in Python. One statement, in data-modifying CTEs:

1. ``b``: the rows, each value turned back into its column's type
   (:func:`value_sql`: the way back of shared/contract/pgtypes.py), those at or below the
   table's floor (its last truncate or snapshot end) left out;
2. ``j``: each joined with the version the target holds for its key
   (``_walcast_target.rows``, deleted rows included);
3. ``w``: the rows newer than that — the only ones written: a row never moves back to
   an older version, and a deleted row is not brought back by an older change;
4. deleted, updated (an unchanged TOAST column keeps the target's value) or inserted
   (a partial row's missing columns left NULL and recorded as unfilled);
5. ``f``: older rows that carry columns the held row lacks fill them
   (:func:`shared.contract.event.fill_unfilled`);
6. the new versions recorded (``at`` set only when a row is recorded or deleted: it
   is read only to forget old tombstones, and an unchanged ``at`` lets Postgres update
   the version in place, V002).

**Floors** (:func:`remove_older_sql`): a truncate at version T, or a snapshot's end at
S, removes the rows held at an older version — under primary-key partitioning rows
newer than the truncate may already be there, from another partition.

Every identifier is quoted by psycopg; a type name comes from
:mod:`services.kafka2postgres.schema`, checked.
"""

from __future__ import annotations

from psycopg import sql

from services.kafka2postgres.schema import Column, TableSchema
from shared.contract.keyranges import KeyRanges

ROWS = sql.SQL('"_walcast_target"."rows"')
TABLES = sql.SQL('"_walcast_target"."tables"')
_TIME = {"d", "t", "z"}


def target_name(schema: str, table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def _declared(c: Column) -> sql.Composable:
    """How ``json_to_record`` reads the column out of the event's row."""
    if c.is_array:
        # nested arrays and NULLs are read by json_to_record itself, element by element
        # through the type's input; elements that need converting are read as JSON
        return sql.SQL("json") if c.kind in _TIME or c.kind == "x" else sql.SQL(c.sql_type)
    return sql.SQL("json") if c.kind == "j" else sql.SQL("text")


def value_sql(c: Column, source: sql.Composable) -> sql.Composable:
    """The column's value in its type, from ``source`` as :func:`_declared` reads it."""
    t = sql.SQL(c.sql_type)
    if c.is_array:
        if c.kind in _TIME or c.kind == "x":
            kind = sql.Literal(c.kind)
            return sql.SQL('"_walcast_target"."array_text"({}, {})::{}').format(source, kind, t)
        return source
    if c.kind == "x":
        return sql.SQL("decode({}, 'base64')::{}").format(source, t)
    if c.kind in _TIME:
        return sql.SQL('"_walcast_target"."time_text"({})::{}').format(source, t)
    return sql.SQL("{}::{}").format(source, t)


def key_text(alias: str, key: tuple[str, ...]) -> sql.Composable:
    """The text ``_walcast_target.rows`` keys a row by: ``ROW(k1, k2)::text``."""
    cols = sql.SQL(", ").join(sql.Identifier(alias, k) for k in key)
    return sql.SQL("ROW({})::text").format(cols)


def _slot(i: int) -> sql.Identifier:
    """The batch's name for the table's i-th column (``c0``, ``c1``...): the envelope's
    fields (``v``, ``d``, ``u``...) can never clash with a column's name."""
    return sql.Identifier(f"c{i}")


def apply_sql(schema_name: str, table: str, schema: TableSchema) -> sql.Composed:
    """The statement applying one batch of one table. Parameters: ``rows`` (the JSON
    array), ``floor``, ``tbl`` (its id in ``_walcast_target.tables``). Returns one row:
    rows given, rows newer than what the target held, deleted, updated, inserted,
    filled."""
    target = target_name(schema_name, table)
    cols = schema.columns
    slot = {c.name: _slot(i) for i, c in enumerate(cols)}
    decls = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c.name), _declared(c)) for c in cols
    )
    values = sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(value_sql(c, sql.Identifier("r", c.name)), slot[c.name])
        for c in cols
    )
    names = sql.SQL(", ").join(sql.Identifier(c.name) for c in cols)
    non_key = [c for c in cols if c.name not in schema.key]

    def same_key(alias: str) -> sql.Composable:
        return sql.SQL(" AND ").join(
            sql.SQL("t.{} = {}.{}").format(sql.Identifier(k), sql.Identifier(alias), slot[k])
            for k in schema.key
        )

    def kept_unless(alias: str, keep: str) -> sql.Composable:
        if not non_key:  # a table of key columns only: the key itself never changes
            k = schema.key[0]
            return sql.SQL("{} = t.{}").format(sql.Identifier(k), sql.Identifier(k))
        return sql.SQL(", ").join(
            sql.SQL("{c} = CASE WHEN {keep} THEN t.{c} ELSE {a}.{s} END").format(
                c=sql.Identifier(c.name),
                keep=sql.SQL(keep).format(name=sql.Literal(c.name)),
                a=sql.Identifier(alias),
                s=slot[c.name],
            )
            for c in non_key
        )

    update_set = kept_unless("w", "w.u IS NOT NULL AND {name} = ANY (w.u)")
    fill_set = kept_unless(
        "f", "NOT ({name} = ANY (f.s_unfilled)) OR {name} = ANY (coalesce(f.u, '{{}}'))"
    )
    select_w = sql.SQL(", ").join(sql.SQL("w.{}").format(slot[c.name]) for c in cols)
    key_b = sql.SQL("ROW({})::text").format(
        sql.SQL(", ").join(sql.SQL("b.{}").format(slot[k]) for k in schema.key)
    )
    return sql.SQL(
        """WITH b AS (
    SELECT e.v, e.d, e.u, e.h, e.x, {values}
    FROM json_to_recordset(%(rows)s::json)
        AS e(v bigint, d boolean, u text[], h bigint, x bigint, r json)
    CROSS JOIN LATERAL json_to_record(e.r) AS r({decls})
    WHERE e.v > %(floor)s
), k AS (
    SELECT b.*, {key_b} AS _k FROM b
), j AS (
    SELECT k.*, s.version AS s_version, s.deleted AS s_deleted, s.unfilled AS s_unfilled
    FROM k LEFT JOIN {rows} AS s ON s.tbl = %(tbl)s AND s.key = k._k
), w AS (
    SELECT * FROM j WHERE j.s_version IS NULL OR j.v > j.s_version
), f AS (
    SELECT * FROM j
    WHERE j.v <= j.s_version AND NOT j.d AND NOT j.s_deleted AND cardinality(j.s_unfilled) > 0
), del AS (
    DELETE FROM {target} AS t USING w WHERE w.d AND {t_is_w} RETURNING 1
), upd AS (
    UPDATE {target} AS t SET {update_set} FROM w WHERE NOT w.d AND {t_is_w} RETURNING 1
), ins AS (
    INSERT INTO {target} ({names})
    SELECT {select_w} FROM w
    WHERE NOT w.d AND NOT EXISTS (SELECT FROM {target} AS t WHERE {t_is_w})
    RETURNING 1
), fill AS (
    UPDATE {target} AS t SET {fill_set} FROM f WHERE {t_is_f} RETURNING 1
), st AS (
    INSERT INTO {rows} AS s (tbl, key, version, deleted, unfilled, hash, xid, at)
    SELECT %(tbl)s, w._k, w.v, w.d,
        CASE
            WHEN w.d OR w.u IS NULL THEN NULL
            WHEN w.s_version IS NULL OR w.s_deleted THEN w.u
            ELSE (SELECT array_agg(c) FROM unnest(w.s_unfilled) AS c WHERE c = ANY (w.u))
        END,
        w.h, w.x, now()
    FROM w
    ON CONFLICT (tbl, key) DO UPDATE SET version = excluded.version,
        deleted = excluded.deleted, unfilled = excluded.unfilled, hash = excluded.hash,
        xid = excluded.xid,
        at = CASE WHEN excluded.deleted THEN excluded.at ELSE s.at END
    RETURNING 1
), fst AS (
    UPDATE {rows} AS s SET unfilled = (
        SELECT array_agg(c) FROM unnest(s.unfilled) AS c WHERE c = ANY (coalesce(f.u, '{{}}')))
    FROM f WHERE s.tbl = %(tbl)s AND s.key = f._k
    RETURNING 1
)
SELECT (SELECT count(*) FROM b), (SELECT count(*) FROM w), (SELECT count(*) FROM del),
    (SELECT count(*) FROM upd), (SELECT count(*) FROM ins), (SELECT count(*) FROM fill),
    (SELECT count(*) FROM st), (SELECT count(*) FROM fst)"""
    ).format(
        values=values,
        decls=decls,
        key_b=key_b,
        rows=ROWS,
        target=target,
        t_is_w=same_key("w"),
        t_is_f=same_key("f"),
        update_set=update_set,
        fill_set=fill_set,
        names=names,
        select_w=select_w,
    )


def remove_older_sql(schema_name: str, table: str, key: tuple[str, ...]) -> sql.Composed:
    """Remove the rows held below version ``%(version)s`` (a truncate at it, a snapshot's
    end): the target's rows whose recorded version is older, or that have none, and the
    versions older than it (tombstones included: the floor keeps those changes out now)."""
    target = target_name(schema_name, table)
    return sql.SQL(
        """WITH gone AS (
    DELETE FROM {target} AS t WHERE NOT EXISTS (
        SELECT FROM {rows} AS s
        WHERE s.tbl = %(tbl)s AND s.key = {key_t} AND s.version >= %(version)s)
    RETURNING 1
), forgotten AS (
    DELETE FROM {rows} WHERE tbl = %(tbl)s AND version < %(version)s RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM forgotten)"""
    ).format(target=target, rows=ROWS, key_t=key_text("t", key))


_TEXT_KEYS = frozenset({"text", "varchar", "bpchar"})


def remove_in_ranges_sql(
    schema_name: str, table: str, schema: TableSchema, ranges: KeyRanges
) -> sql.Composed:
    """Remove the rows held below version ``%(version)s`` whose key lies in ``ranges`` (a
    snapshot of key ranges' end: ``repair``), compared in the order every side shares
    (shared/contract/keyranges.py: text by code point, ``COLLATE "C"``). Nothing outside
    the ranges; the versions stay. Returns one row: the rows removed."""
    types = {c.name: c.type for c in schema.columns}
    cols = [
        sql.SQL('{} COLLATE "C"').format(sql.Identifier("t", c)) if types.get(c) in _TEXT_KEYS
        else sql.Identifier("t", c)
        for c in ranges.columns
    ]  # fmt: skip
    key = cols[0] if len(cols) == 1 else sql.SQL("({})").format(sql.SQL(", ").join(cols))

    def bound(values: tuple[object, ...]) -> sql.Composable:
        lits = sql.SQL(", ").join(sql.Literal(v) for v in values)
        return lits if len(values) == 1 else sql.SQL("({})").format(lits)

    within: list[sql.Composable] = []
    for lower, upper in ranges.ranges:
        parts: list[sql.Composable] = [sql.SQL("true")]
        if lower is not None:
            parts.append(sql.SQL("{} > {}").format(key, bound(lower)))
        if upper is not None:
            parts.append(sql.SQL("{} <= {}").format(key, bound(upper)))
        within.append(sql.SQL("({})").format(sql.SQL(" AND ").join(parts)))
    return sql.SQL(
        """WITH gone AS (
    DELETE FROM {target} AS t WHERE ({within}) AND NOT EXISTS (
        SELECT FROM {rows} AS s
        WHERE s.tbl = %(tbl)s AND s.key = {key_t} AND s.version >= %(version)s)
    RETURNING 1
)
SELECT count(*) FROM gone"""
    ).format(
        target=target_name(schema_name, table), within=sql.SQL(" OR ").join(within), rows=ROWS,
        key_t=key_text("t", schema.key),
    )  # fmt: skip
