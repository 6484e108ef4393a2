"""The Postgres side of ``verify`` (:class:`~shared.verify.core.VerifySource`): a table's
key ranges with their count and row-hash sum, a range's rows, and the marker request.

Every range is read in its own short ``REPEATABLE READ, READ ONLY`` transaction, which
also reads its snapshot: one index-ordered scan of the ``max_rows`` keys after the lower
bound gives the range's rows, count, hash sum and upper bound (its last key) — no
transaction outlives one range, and ``rows_per_s`` paces the reads. With ``workers`` > 1
(``verify.workers``) the bounds are found first by a walk of the key's index and that
many connections read ranges at once. The row
hash is :func:`shared.contract.rowhash.row_hash_sql` over the columns the stream carries,
in a session with the same text-output settings as pg2kafka's
(:data:`~shared.contract.rowhash.TEXT_OUTPUT_OPTIONS`).

Keys: the primary key, else the replica identity index — the key events carry. Ranges
follow the one order of keys the sinks' range queries share (:mod:`shared.contract.keyorder`):
integer, uuid, text, varchar, bpchar, date, timestamp and timestamptz columns (and tuples of
them); a text column under a collation that is not byte order is compared ``COLLATE "C"``,
and needs an index sorting it so (the error says which to create). Dates and timestamps are
read as the text events carry (:func:`~shared.contract.keyorder.key_text`); a range holding
a key whose order the sinks do not share (``infinity``, a year BC, a control character in a
``bpchar``) stops the table's verification, saying so. Other key types are refused with what
to do (docs/design.md#verification).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Loader
from psycopg.types.json import Jsonb

from shared.contract.keyorder import (
    ORDERED_KEY_TYPES,
    TIME_KEY_TYPES,
    c_index_statement,
    has_c_index,
    key_columns,
    key_expr,
    key_text,
    sortable_sql,
)
from shared.contract.rowhash import TEXT_OUTPUT_OPTIONS, row_hash_sql
from shared.errors import PermanentError, UnverifiableError, WaitExpiredError
from shared.settings import SAFE_SEARCH_PATH
from shared.verify.core import KeyRange, Snapshot, SourceRange, SourceRow, Summary


@dataclass(frozen=True)
class TableShape:
    """What verifying a table needs of its definition: the columns the stream carries (not
    dropped, not generated), its key columns in key order, and whether it is partitioned
    (its rows are in its partitions)."""

    columns: tuple[str, ...]
    key: tuple[str, ...]
    key_types: tuple[str, ...]  # pg_type.typname of each key column
    partitioned: bool
    collate_c: tuple[bool, ...] = ()  # per key column: compared COLLATE "C"


class _KeyTextLoader(Loader):
    """A date or timestamp as the text events carry (:func:`key_text`): keys compare,
    bound ranges and go back into queries as that text, never as Python's types (which
    hold no ``infinity`` and no year BC)."""

    def load(self, data: Any) -> str:
        return key_text(bytes(data).decode())


class PostgresSource:
    """Reads ``conninfo``'s tables for ``verify``; ``rows_per_s``: the most rows it reads
    per second (None: as fast as Postgres answers). ``session_options``: added to the
    text-output settings (the Debezium format's ``lc_monetary=C``)."""

    def __init__(
        self,
        conninfo: str,
        rows_per_s: float | None = None,
        session_options: str = "",
        workers: int = 1,
    ) -> None:
        self.conninfo = conninfo
        self.rows_per_s = rows_per_s
        self.workers = max(1, workers)
        self._pace_lock = threading.Lock()
        # SAFE_SEARCH_PATH first: the options replace those of the conninfo string.
        self.options = f"{SAFE_SEARCH_PATH} {TEXT_OUTPUT_OPTIONS} {session_options}".strip()
        self._shapes: dict[tuple[str, str], TableShape] = {}
        self._read = 0
        self._started = time.monotonic()

    def connect(self) -> psycopg.Connection[Any]:
        """A connection in this reader's session settings, keys read as it reads them."""
        return self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.conninfo, autocommit=True, options=self.options)
        for name in TIME_KEY_TYPES:
            conn.adapters.register_loader(name, _KeyTextLoader)
        return conn

    def shape(self, table: tuple[str, str]) -> TableShape:
        """The table's columns and key (read once); PermanentError when it has no key
        walcast streams it by, or a key whose order the sinks do not share."""
        got = self._shapes.get(table)
        if got is not None:
            return got
        name = ".".join(table)
        with self._connect() as conn:
            row = conn.execute(
                "SELECT c.oid, c.relkind FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relname = %s",
                list(table),
            ).fetchone()
            if row is None:
                raise UnverifiableError(f"verify: no table {name} in the source database")
            oid, relkind = row
            cols = conn.execute(
                "SELECT a.attname, t.typname, a.attnum FROM pg_catalog.pg_attribute a"
                " JOIN pg_catalog.pg_type t ON t.oid = a.atttypid"
                " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"
                " AND a.attgenerated = '' ORDER BY a.attnum",
                [oid],
            ).fetchall()
            index = conn.execute(
                "SELECT i.indkey::int2[] FROM pg_catalog.pg_index i WHERE i.indrelid = %s"
                " AND (i.indisprimary OR i.indisreplident) ORDER BY i.indisprimary DESC LIMIT 1",
                [oid],
            ).fetchone()
            if index is None:
                raise UnverifiableError(
                    f"verify: {name} has no primary key or replica identity index",
                    hint="verify compares keyed tables; add a primary key",
                )
            key = key_columns(conn, int(oid), [int(num) for num in index[0]])
            odd = [f"{c.name} ({c.type})" for c in key if c.type not in ORDERED_KEY_TYPES]
            if odd:
                raise UnverifiableError(
                    f"verify: {name}'s key column {', '.join(odd)} is of a type whose order"
                    " the sinks do not share",
                    hint="verify compares tables keyed by integer, uuid, text, varchar,"
                    " char(n), date, timestamp or timestamptz columns",
                )
            if any(c.collate_c for c in key) and not has_c_index(conn, int(oid), key):
                raise UnverifiableError(
                    f"verify: {name}'s key is text under a collation that does not sort by"
                    " code point, the order the sinks share, and no index sorts it so",
                    hint=f"create one: {c_index_statement(table, key)}",
                )
        got = TableShape(
            tuple(str(n) for n, _, _ in cols),
            tuple(c.name for c in key),
            tuple(c.type for c in key),
            relkind == "p",
            tuple(c.collate_c for c in key),
        )
        self._shapes[table] = got
        return got

    def assume(self, table: tuple[str, str], shape: TableShape) -> None:
        """Read ``table`` as having ``shape``: a copy of a source table in another
        database (kafka2postgres's target), compared by the source's columns and key."""
        self._shapes[table] = shape

    def selection(
        self, table: tuple[str, str], rng: KeyRange
    ) -> tuple[sql.Composable, sql.Composable]:
        """(the table as a FROM item aliased ``s``, the condition of ``rng`` on it, in the
        shared key order): for a reader of this database's rows in a range."""
        _shape, source, key = self._parts(table)
        return source, self._where(key, rng)

    def summary(self, table: tuple[str, str], rng: KeyRange) -> Summary:
        """``rng``'s row count and hash sum as this database holds them now."""
        shape, source, key = self._parts(table)
        with self._connect() as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*), coalesce(sum({}), 0)::text FROM {} WHERE {}").format(
                    row_hash_sql(shape.columns, "s"), source, self._where(key, rng)
                )
            ).fetchone()
        assert row is not None
        self._pace(int(row[0]))
        return Summary(int(row[0]), int(row[1]))

    def _parts(self, table: tuple[str, str]) -> tuple[TableShape, sql.Composable, sql.Composable]:
        """(shape, the table as a FROM item aliased ``s``, its key as a row)."""
        shape = self.shape(table)
        only = sql.SQL("") if shape.partitioned else sql.SQL("ONLY ")
        source = sql.SQL("{}{} s").format(only, sql.Identifier(*table))
        cols = self._keys(shape)
        key = cols if len(shape.key) == 1 else sql.SQL("({})").format(cols)
        return shape, source, key

    @staticmethod
    def _key_exprs(shape: TableShape) -> list[sql.Composable]:
        """Each key column as compared and ordered (``COLLATE "C"`` where needed)."""
        collate = shape.collate_c or (False,) * len(shape.key)
        return [
            key_expr(sql.Identifier("s", k), c) for k, c in zip(shape.key, collate, strict=True)
        ]

    @classmethod
    def _keys(cls, shape: TableShape) -> sql.Composable:
        return sql.SQL(", ").join(cls._key_exprs(shape))

    @staticmethod
    def _bound(values: tuple[object, ...]) -> sql.Composable:
        lits = sql.SQL(", ").join(sql.Literal(v) for v in values)
        return lits if len(values) == 1 else sql.SQL("({})").format(lits)

    def _where(self, key: sql.Composable, rng: KeyRange) -> sql.Composable:
        parts: list[sql.Composable] = []
        if rng.lower is not None:
            parts.append(sql.SQL("{} > {}").format(key, self._bound(rng.lower)))
        if rng.upper is not None:
            parts.append(sql.SQL("{} <= {}").format(key, self._bound(rng.upper)))
        return sql.SQL(" AND ").join(parts) if parts else sql.SQL("true")

    def _pace(self, rows: int) -> None:
        with self._pace_lock:
            self._read += rows
            ahead = (
                self._read / self.rows_per_s - (time.monotonic() - self._started)
                if self.rows_per_s
                else 0.0
            )
        if ahead > 0:
            time.sleep(ahead)

    def ranges(self, table: tuple[str, str], max_rows: int) -> Iterator[SourceRange]:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        if self.workers > 1:
            yield from self._ranges_in_parallel(table, max_rows)
            return
        shape, source, key = self._parts(table)
        keys = self._keys(shape)
        # r's columns: the key as k0, k1, ... and the hash as h (names of our own)
        named = [sql.Identifier(f"k{i}") for i in range(len(shape.key))]
        as_named = sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(k, n)
            for k, n in zip(self._key_exprs(shape), named, strict=True)
        )
        desc = sql.SQL(", ").join(sql.SQL("{} DESC").format(n) for n in named)
        # One index-ordered scan per range: its first max_rows keys after the lower bound,
        # hashed, then their count, sum and last key (the range's upper bound).
        query = sql.SQL(
            "WITH r AS MATERIALIZED (SELECT {as_named}, {h} AS h FROM {src} WHERE {after}"
            " ORDER BY {keys} LIMIT {n})"
            " SELECT c.n, c.s, c.ok, l.* FROM (SELECT count(*) AS n,"
            " coalesce(sum(h), 0)::text AS s, {ok} AS ok FROM r) c"
            " LEFT JOIN LATERAL (SELECT {named} FROM r ORDER BY {desc} LIMIT 1) l ON true"
        )
        params = {
            "as_named": as_named, "h": row_hash_sql(shape.columns, "s"), "src": source,
            "keys": keys, "n": sql.Literal(max_rows), "named": sql.SQL(", ").join(named),
            "desc": desc, "ok": _sortable(named, shape.key_types),
        }  # fmt: skip
        lower: tuple[object, ...] | None = None
        with self._connect() as conn:
            while True:
                after = self._where(key, KeyRange(lower, None))
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    snap = _snapshot(conn)
                    row = conn.execute(query.format(after=after, **params)).fetchone()
                assert row is not None
                count, total, last = int(row[0]), int(row[1]), tuple(row[3:])
                _check_sortable(table, row[2], KeyRange(lower, last if count else None))
                # fewer than max_rows: the last range, open above (rows added later beyond
                # the last key belong to it)
                upper = last if count == max_rows else None
                self._pace(count)
                yield SourceRange(KeyRange(lower, upper), Summary(count, total), snap)
                if upper is None:
                    return
                lower = upper

    def _ranges_in_parallel(self, table: tuple[str, str], max_rows: int) -> Iterator[SourceRange]:
        """``workers`` connections read ranges at once: one walks the key's index for the
        bounds (the key ``max_rows`` after the lower bound: no row hashed, no heap read
        when the index covers it), the others read each range's count and hash sum, each
        in its own short transaction with its snapshot, as the single scan does. Ranges
        come out in key order."""
        shape, source, key = self._parts(table)
        keys = self._keys(shape)
        bound_q = sql.SQL("SELECT {keys} FROM {src} WHERE {after} ORDER BY {keys}"
                          " OFFSET {skip} LIMIT 1")  # fmt: skip
        summary_q = sql.SQL(
            "SELECT count(*), coalesce(sum({h}), 0)::text, {ok} FROM {src} WHERE {where}"
        )
        ok = _sortable([sql.Identifier("s", k) for k in shape.key], shape.key_types)
        h = row_hash_sql(shape.columns, "s")
        local = threading.local()
        opened: list[psycopg.Connection[Any]] = []

        def summary(rng: KeyRange) -> SourceRange:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = self._connect()
                opened.append(conn)
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                snap = _snapshot(conn)
                row = conn.execute(
                    summary_q.format(h=h, src=source, where=self._where(key, rng), ok=ok)
                ).fetchone()
            assert row is not None
            _check_sortable(table, row[2], rng)
            self._pace(int(row[0]))
            return SourceRange(rng, Summary(int(row[0]), int(row[1])), snap)

        def bounds() -> Iterator[KeyRange]:
            lower: tuple[object, ...] | None = None
            with self._connect() as conn:
                while True:
                    after = self._where(key, KeyRange(lower, None))
                    row = conn.execute(
                        bound_q.format(
                            keys=keys, src=source, after=after, skip=sql.Literal(max_rows - 1)
                        )
                    ).fetchone()
                    upper = None if row is None else tuple(row)
                    yield KeyRange(lower, upper)
                    if upper is None:
                        return
                    lower = upper

        pending: deque[Future[SourceRange]] = deque()
        try:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="verify-pg") as pool:
                for rng in bounds():
                    pending.append(pool.submit(summary, rng))
                    while len(pending) > 2 * self.workers:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
            for conn in opened:
                conn.close()

    def rows(self, table: tuple[str, str], rng: KeyRange) -> tuple[list[SourceRow], Snapshot]:
        shape, source, key = self._parts(table)
        keys = sql.SQL(", ").join(sql.Identifier("s", k) for k in shape.key)
        query = sql.SQL("SELECT {}, {}, s.xmin::text FROM {} WHERE {}").format(
            keys, row_hash_sql(shape.columns, "s"), source, self._where(key, rng)
        )
        n = len(shape.key)
        with self._connect() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            snap = _snapshot(conn)
            got = [
                SourceRow(tuple(r[:n]), int(r[n]), int(r[n + 1]))
                for r in conn.execute(query).fetchall()
            ]
        self._pace(len(got))
        return got, snap

    def database(self) -> str:
        """The source database's name (sinks name what they hold after it)."""
        with self._connect() as conn:
            row = conn.execute("SELECT pg_catalog.current_database()").fetchone()
        assert row is not None
        return str(row[0])

    def mark(self, mark_id: str, tables: Sequence[tuple[str, str]]) -> int:
        with self._connect() as conn:
            names = [sql.Identifier(*t).as_string(conn) for t in tables]
            try:
                row = conn.execute(
                    "SELECT _walcast.verify_mark(%s, %s::text[]::pg_catalog.regclass[])",
                    [mark_id, names],
                ).fetchone()
            except psycopg.errors.InsufficientPrivilege as exc:
                raise PermanentError(
                    f"verify: this role may not ask pg2kafka for a verification marker: {exc}",
                    hint="GRANT walcast_verifier TO the role verify connects as",
                ) from exc
            except psycopg.errors.UndefinedFunction as exc:
                raise PermanentError(
                    "verify: the source has no _walcast.verify_mark (pg2kafka's migration V020)",
                    hint="run pg2kafka init with this version",
                ) from exc
            if row is None or row[0] is None:
                raise PermanentError(
                    "verify: no marker was written (the source's _walcast.message_key is empty)",
                    hint="run pg2kafka init",
                )
            # After the marker's transaction committed (autocommit): the WAL's end now is
            # past its commit record. The message's own position is not enough: a slot
            # can pass it before the commit that streams it is decoded.
            end = conn.execute(
                "SELECT (pg_catalog.pg_current_wal_lsn() - '0/0'::pg_catalog.pg_lsn)::bigint"
            ).fetchone()
        assert end is not None
        return int(end[0])

    def request_repair(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[int]:
        """Ask pg2kafka to read ``ranges`` of ``table`` again (``_walcast.request_repair``,
        V021): the ids of the requests filed, one per publication streaming the table."""
        pairs = [[_bound_json(r.lower), _bound_json(r.upper)] for r in ranges]
        with self._connect() as conn:
            name = sql.Identifier(*table).as_string(conn)
            try:
                rows = conn.execute(
                    "SELECT * FROM _walcast.request_repair(%s::text::pg_catalog.regclass, %s)",
                    [name, Jsonb(pairs)],
                ).fetchall()
            except psycopg.errors.InsufficientPrivilege as exc:
                raise PermanentError(
                    f"repair: this role may not ask pg2kafka to read rows again: {exc}",
                    hint="GRANT walcast_repairer TO the role verify connects as",
                ) from exc
            except psycopg.errors.UndefinedFunction as exc:
                raise PermanentError(
                    "repair: the source has no _walcast.request_repair (pg2kafka's migration V021)",
                    hint="run pg2kafka init with this version",
                ) from exc
            except (
                psycopg.errors.InvalidParameterValue,
                psycopg.errors.FeatureNotSupported,
            ) as exc:
                raise PermanentError(f"repair of {'.'.join(table)}: {exc}") from exc
        return [int(r[0]) for r in rows]

    def repair_progress(self, ids: Sequence[int]) -> list[tuple[int, str, str, int, int]]:
        """(id, publication, state, chunks done, chunks planned) of each request."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT * FROM _walcast.repair_progress(%s::bigint[])", [list(ids)]
            ).fetchall()
        return [(int(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4])) for r in rows]

    def next_xid(self) -> int:
        return self._snapshot_bound("xmax")

    def oldest_xid(self) -> int:
        return self._snapshot_bound("xmin")

    def _snapshot_bound(self, bound: str) -> int:
        """``xmin`` or ``xmax`` of a snapshot taken now (64-bit transaction ids)."""
        query = {
            "xmin": "SELECT pg_catalog.pg_snapshot_xmin(pg_catalog.pg_current_snapshot())::text",
            "xmax": "SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text",
        }[bound]
        with self._connect() as conn:
            row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])

    def wait_streamed(self, slot: str, lsn: int, timeout_s: float) -> None:
        """Return once pg2kafka's slot ``slot`` has confirmed past ``lsn``: everything
        before it, the marker's copies included, acknowledged by Kafka."""
        deadline = time.monotonic() + timeout_s
        with self._connect() as conn:
            while True:
                row = conn.execute(
                    "SELECT (confirmed_flush_lsn - '0/0'::pg_catalog.pg_lsn)::bigint, active"
                    " FROM pg_catalog.pg_replication_slots WHERE slot_name = %s",
                    [slot],
                ).fetchone()
                if row is None:
                    raise PermanentError(
                        f"verify: no replication slot {slot!r} in the source",
                        hint="set verify.slot to pg2kafka's replication.slot",
                    )
                if row[0] is not None and int(row[0]) >= lsn:
                    return
                if time.monotonic() > deadline:
                    state = "streamed" if row[1] else "not streamed (is pg2kafka running?)"
                    raise WaitExpiredError(
                        f"verify: slot {slot!r} ({state}) has not passed the marker at"
                        f" {lsn} within {timeout_s:.0f}s"
                    )
                time.sleep(0.2)


def _sortable(columns: Sequence[sql.Composable], types: Sequence[str]) -> sql.Composable:
    """An aggregate, true when every key of the rows aggregated is in the order every side
    shares (:func:`~shared.contract.keyorder.sortable_sql`); NULL over no rows."""
    conds = [
        c for c in (sortable_sql(col, t) for col, t in zip(columns, types, strict=True))
        if c is not None
    ]  # fmt: skip
    if not conds:
        return sql.SQL("true")
    return sql.SQL("bool_and({})").format(sql.SQL(" AND ").join(conds))


def _check_sortable(table: tuple[str, str], ok: object, rng: KeyRange) -> None:
    if ok is False:
        raise UnverifiableError(
            f"verify: {'.'.join(table)} holds a key in {rng} whose order the sinks do not"
            " share: a date or timestamp outside the years 1 to 9999 (infinity, a year BC),"
            " or a char(n) value with a control character",
            hint="such a table is compared by a plain read of both sides, not by verify",
        )


def _bound_json(bound: tuple[object, ...] | None) -> list[object] | None:
    """A key bound as the signal table takes it: integers, and the rest (UUIDs, text) as
    text."""
    if bound is None:
        return None
    return [v if isinstance(v, int) else str(v) for v in bound]


def _snapshot(conn: psycopg.Connection[Any]) -> Snapshot:
    row = conn.execute("SELECT pg_catalog.pg_current_snapshot()::text").fetchone()
    assert row is not None
    return Snapshot.parse(str(row[0]))
