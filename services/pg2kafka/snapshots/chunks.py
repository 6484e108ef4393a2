"""What a snapshot reads: the published tables as their events name them, their chunks
(page ranges, or key ranges for incremental snapshots), and the COPY that reads one
chunk — as text for the stream's converters, or as JSON Postgres writes itself for the
tables whose types allow it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg import sql

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.types import TypeRegistry
from shared.contract.event import EVENT_VERSION, SnapshotInfo
from shared.contract.keyorder import key_expr, named_key_columns
from shared.contract.keyranges import KeyRangesJson
from shared.contract.rowhash import row_hash_sql

log = logging.getLogger(__name__)

# Types whose to_json() is exactly what the stream's conversion makes of their text:
# bool, int8, int2, int4 (JSON literals), name, text, bpchar, varchar, uuid (strings of
# the type's output). Anything else (numeric, floats, dates, bytea, json, arrays, inet's
# netmask, ...) goes through the converters.
PG_JSON_TYPES = frozenset({16, 19, 20, 21, 23, 25, 1042, 1043, 2950})


@dataclass(frozen=True)
class TableSpec:
    """A published table as its events name it, with the relations holding its rows
    (the table itself, or each leaf partition: the publication publishes partitioned
    tables under the root's name)."""

    relation: pg.Relation
    leaves: tuple[tuple[int, int], ...]  # (relation oid, pages now)
    rows_estimate: int | None

    @property
    def schema(self) -> str:
        return self.relation.schema

    @property
    def name(self) -> str:
        return self.relation.table


@dataclass(frozen=True)
class Chunk:
    snapshot_id: int
    schema: str
    table: str
    chunk: int
    relation: int | None
    first_page: int | None
    end_page: int | None
    lower_key: list[str] | None = None
    upper_key: list[str] | None = None
    # Which key bounds the chunk includes, as a range type writes it (V021): '[)' for the
    # chunks of a whole table; a snapshot of key ranges (lower < key <= upper) starts a
    # range's first chunk with '(' and ends its last with ']'.
    bounds: str = "[)"
    # Only these keys of the range (each as the events' key, JSON text): the keys of an
    # earlier chunk read again (V019, services/pg2kafka/snapshots/incremental.py). None: every row.
    only_keys: list[str] | None = None
    # A chunk of a snapshot of key ranges: its keys compared in the order every sink shares
    # (text COLLATE "C": shared/contract/keyorder.py), the order its ranges were cut by.
    byte_order: bool = False


@dataclass
class Job:
    id: int
    slot: str
    kind: str
    version: int
    state: str
    epoch: int = 0  # the source's epoch its events carry (not stored: the stream's, now)
    started_us: int = 0  # when the run was created (µs since the epoch)


def describe_tables(
    conn: psycopg.Connection[Any],
    publication: str,
    table_filter: TableFilter,
    only: set[tuple[str, str]] | None = None,
    *,
    also: tuple[str, ...] = (),
) -> list[TableSpec]:
    """The publication's tables that the filters let through, described from the
    catalog the way pgoutput describes them: the columns it sends (no dropped or
    generated ones) and which are key — the primary key, the replica identity index, or
    under ``REPLICA IDENTITY FULL`` the primary key if there is one, else every column
    (a table without a key is keyed by its whole row, as its changes are). ``also``:
    further publications whose tables are included (the initial snapshot passes the
    insert-only one: its tables have no key column, their rows are ``append_only``)."""
    out = []
    rows = conn.execute(
        "SELECT DISTINCT t.schemaname, t.tablename, c.oid, c.relreplident"
        " FROM pg_catalog.pg_publication_tables t"
        " JOIN pg_catalog.pg_namespace n ON n.nspname = t.schemaname"
        " JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename"
        " WHERE t.pubname = ANY(%s) ORDER BY 1, 2",
        [[publication, *also]],
    ).fetchall()
    for schema, table, oid, ident in rows:
        if not table_filter.matches(schema, table):
            continue
        if only is not None and (schema, table) not in only:
            continue
        cols = conn.execute(
            "SELECT a.attname, a.atttypid, a.atttypmod,"
            " EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = a.attrelid"
            "   AND i.indisprimary AND a.attnum = ANY(i.indkey)),"
            " EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indrelid = a.attrelid"
            "   AND i.indisreplident AND a.attnum = ANY(i.indkey))"
            " FROM pg_catalog.pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0"
            " AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
            [oid],
        ).fetchall()
        has_pk = any(c[3] for c in cols)
        columns = []
        for name, typ, typmod, in_pk, in_ri in cols:
            if ident == "i":
                is_key = bool(in_ri)
            elif ident == "f":
                is_key = bool(in_pk) or not has_pk
            elif ident == "d":
                is_key = bool(in_pk)
            else:
                is_key = False
            columns.append(pg.Column(str(name), int(typ), int(typmod), is_key))
        leaves = conn.execute(
            "SELECT p.relid::oid, pg_catalog.pg_relation_size(p.relid)"
            " / current_setting('block_size')::int, c.reltuples, c.relpages"
            " FROM (SELECT relid FROM pg_catalog.pg_partition_tree(%s) WHERE isleaf"
            "       UNION SELECT %s::regclass) p"
            " JOIN pg_catalog.pg_class c ON c.oid = p.relid"
            " WHERE c.relkind = 'r' ORDER BY 1",
            [oid, oid],
        ).fetchall()
        estimate = 0
        known = True
        for _, pages, tuples, relpages in leaves:
            if tuples is None or tuples < 0:
                known = known and pages == 0
            elif relpages > 0:
                estimate += int(tuples / relpages * pages)
        relation = pg.Relation(int(oid), str(schema), str(table), str(ident), tuple(columns))
        out.append(
            TableSpec(
                relation,
                tuple((int(r[0]), int(r[1])) for r in leaves),
                estimate if known else None,
            )
        )
    return out


Bounds = tuple[int | None, int | None, int | None, list[str] | None, list[str] | None, str]
"""A chunk's range: (relation, first page, end page, lower key, upper key, which key
bounds it includes: '[)', '(]', '()' or '[]')."""


def plan_chunks(spec: TableSpec, chunk_pages: int) -> list[Bounds]:
    """Page ranges per chunk; each relation's last chunk is open (it takes whatever the
    relation has grown to)."""
    chunks: list[Bounds] = []
    for oid, pages in spec.leaves:
        first = 0
        while first + chunk_pages < pages:
            chunks.append((oid, first, first + chunk_pages, None, None, "[)"))
            first += chunk_pages
        chunks.append((oid, first, None, None, None, "[)"))
    return chunks


def key_ranges(
    conn: psycopg.Connection[Any],
    spec: TableSpec,
    chunk_rows: int,
    within: tuple[list[str] | None, list[str] | None] = (None, None),
    byte_order: bool = False,
) -> list[Bounds]:
    """Chunks of ``chunk_rows`` keys: the boundaries from one ordered pass over the key
    (an index-only scan of the primary key), first and last range open. ``within``: only
    the keys lower < key <= upper (a snapshot of key ranges; None: unbounded), the first
    chunk excluding ``lower`` and the last including ``upper``. ``byte_order``: in the
    order every sink shares (a snapshot of key ranges), not the key's collation."""
    keys = [sql.Identifier(c.name) for c in spec.relation.columns if c.is_key]
    texts = sql.SQL(", ").join(sql.SQL("{}::text").format(k) for k in keys)
    listed = sql.SQL(", ").join(_ordered(conn, spec.relation, keys) if byte_order else keys)
    lo, hi = within
    query = sql.SQL(
        "SELECT json_build_array({texts}) FROM (SELECT {keys}, row_number() OVER"
        " (ORDER BY {keys}) AS walcast_rn FROM {table} WHERE {where}) s"
        " WHERE walcast_rn % {n} = 0 ORDER BY {keys}"
    ).format(
        texts=texts,
        keys=listed,
        table=sql.Identifier(spec.schema, spec.name),
        where=key_where(conn, spec.relation, lo, hi, "(]", byte_order),
        n=sql.Literal(chunk_rows),
    )
    cuts = [list(r[0]) for r in conn.execute(query).fetchall()]
    out: list[Bounds] = []
    lower: list[str] | None = lo
    for n, upper in enumerate([*cuts, hi]):
        first, last = n == 0, n == len(cuts)
        bounds = ("(" if first and lo is not None else "[") + (
            "]" if last and hi is not None else ")"
        )
        out.append((None, None, None, lower, upper, bounds))
        lower = upper
    return out


def ranged_chunks(
    conn: psycopg.Connection[Any], spec: TableSpec, chunk_rows: int, ranges: KeyRangesJson
) -> list[Bounds]:
    """The chunks of a snapshot of key ranges: each range's keys in chunks of
    ``chunk_rows`` (V021; ``ranges`` as shared/contract/keyranges.py shapes them)."""
    out: list[Bounds] = []
    for lower, upper in ranges["ranges"]:
        within = (
            None if lower is None else [str(v) for v in lower],
            None if upper is None else [str(v) for v in upper],
        )
        out.extend(key_ranges(conn, spec, chunk_rows, within, byte_order=True))
    return out


def _ordered(
    conn: psycopg.Connection[Any], rel: pg.Relation, keys: list[sql.Identifier]
) -> list[sql.Composable]:
    """The key columns as the order every sink shares compares them."""
    names = [c.name for c in rel.columns if c.is_key]
    collate = [c.collate_c for c in named_key_columns(conn, (rel.schema, rel.table), names)]
    return [key_expr(k, c) for k, c in zip(keys, collate, strict=True)]


def pg_json_table(rel: pg.Relation, types: TypeRegistry) -> bool:
    """Whether Postgres can write the table's rows as JSON (see :data:`PG_JSON_TYPES`)."""
    return all(c.type_oid in PG_JSON_TYPES for c in rel.columns)


def pg_json_frame(
    db: str,
    rel: pg.Relation,
    version: int,
    read_at: str,
    info: SnapshotInfo,
    builder: EventBuilder,
    epoch: int = 0,
    *,
    append_only: bool = False,
) -> tuple[bytes, bytes, bytes, bytes]:
    """The bytes around a read row's seq, key, row and row hash, in the contract's field
    order (``append_only``: a row of an insert-only table, flagged as the builder flags
    it)."""
    dumps = orjson.dumps
    types = {c.name: builder.types.name(c.type_oid) for c in rel.columns}
    head = b'{"v":%d,"op":"read","db":%b,"schema":%b,"table":%b,"lsn":%d,"seq":' % (
        EVENT_VERSION, dumps(db), dumps(rel.schema), dumps(rel.table), version)  # fmt: skip
    middle = b',"commit_lsn":%d,"xid":0,"commit_ts":%b,"key":' % (version, dumps(read_at))
    hash_field = b',"old":null,"hash":'
    tail = b',"types":%b,"snapshot":%b' % (dumps(types), dumps(info))
    if epoch:
        tail += b',"epoch":%d' % epoch
    tail += b',"append_only":true}' if append_only else b"}"
    return head, middle, hash_field, tail


def chunk_where(conn: psycopg.Connection[Any], rel: pg.Relation, chunk: Chunk) -> sql.Composable:
    """The rows of a chunk: its pages (``ctid`` range, a TID range scan) or its keys
    (between ``lower_key`` and ``upper_key`` as ``bounds`` says, each bound cast to the
    key column's type)."""
    if chunk.first_page is not None:
        where: sql.Composable = sql.SQL("ctid >= {}::tid").format(
            sql.Literal(f"({chunk.first_page},0)")
        )
        if chunk.end_page is not None:
            where = sql.SQL("{} AND ctid < {}::tid").format(
                where, sql.Literal(f"({chunk.end_page},0)")
            )
        return where
    return key_where(conn, rel, chunk.lower_key, chunk.upper_key, chunk.bounds, chunk.byte_order)


def key_where(
    conn: psycopg.Connection[Any],
    rel: pg.Relation,
    lower: list[str] | None,
    upper: list[str] | None,
    bounds: str = "[)",
    byte_order: bool = False,
) -> sql.Composable:
    """The rows whose key lies between ``lower`` and ``upper`` (each the key columns'
    text; None: unbounded), each included as ``bounds`` says ('[)', '(]', '()', '[]'),
    in the key's order (the tuple's) — ``byte_order``: the order every sink shares."""
    if bounds not in ("[)", "(]", "()", "[]"):
        raise ValueError(f"key bounds {bounds!r}")
    keys = [c for c in rel.columns if c.is_key]
    types = [
        str(conn.execute("SELECT format_type(%s, %s)", [c.type_oid, c.type_modifier]).fetchone()[0])  # type: ignore[index]
        for c in keys
    ]
    idents = [sql.Identifier(c.name) for c in keys]
    names = sql.SQL(", ").join(_ordered(conn, rel, idents) if byte_order else idents)
    lhs = names if len(keys) == 1 else sql.SQL("({})").format(names)

    def bound(values: list[str]) -> sql.Composable:
        # format_type() quotes what needs quoting: server text, not user input.
        casts = sql.SQL(", ").join(
            sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(t))
            for v, t in zip(values, types, strict=True)
        )
        return casts if len(keys) == 1 else sql.SQL("({})").format(casts)

    parts = []
    if lower is not None:
        op = ">=" if bounds[0] == "[" else ">"
        parts.append(sql.SQL("{} {} {}").format(lhs, sql.SQL(op), bound(lower)))
    if upper is not None:
        op = "<=" if bounds[1] == "]" else "<"
        parts.append(sql.SQL("{} {} {}").format(lhs, sql.SQL(op), bound(upper)))
    return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")


def chunk_query(
    name: sql.Composable,
    rel: pg.Relation,
    where: sql.Composable,
    pg_json: bool,
    *,
    by_ctid: bool = False,
) -> sql.Composed:
    """COPY of one chunk's rows: the columns pgoutput sends, as text; or, for a table
    Postgres can write as JSON, its key, its row as JSON and its row hash
    (:func:`shared.contract.rowhash.row_hash_sql`). ``by_ctid``: in physical order (an
    insert-only table's chunk, whose rows are numbered by their place)."""
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in rel.columns)
    inner = sql.SQL("SELECT {} FROM ONLY {} WHERE {}{}").format(
        cols, name, where, sql.SQL(" ORDER BY ctid") if by_ctid else sql.SQL("")
    )
    if not pg_json:
        return sql.SQL("COPY ({}) TO STDOUT").format(inner)
    keys = [c for c in rel.columns if c.is_key]
    key: sql.Composable
    if keys and len(keys) < len(rel.columns):
        key = sql.SQL("json_build_object({})::text").format(
            sql.SQL(", ").join(
                sql.SQL("{}, s.{}").format(sql.Literal(c.name), sql.Identifier(c.name))
                for c in keys
            )
        )
    else:
        key = sql.SQL("NULL::text")  # every column is the key (or none is): the row
    row_hash = row_hash_sql([c.name for c in rel.columns], "s")
    return sql.SQL("COPY (SELECT {}, to_json(s)::text, {} FROM ({}) s) TO STDOUT").format(
        key, row_hash, inner
    )
