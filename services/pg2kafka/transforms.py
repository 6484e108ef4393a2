"""Column transformers: what sensitive columns look like once they leave the database.

Rules (``transforms.rules``, :class:`~services.pg2kafka.settings.TransformRule`) name
columns by ``schema.table.column`` patterns; the first rule matching a column applies to
it. They act on the values' text — the text output pgoutput and the snapshot's COPY give —
before a row is encoded, so the one rewrite covers change events, snapshot rows, ``old``
images and keys in both output formats. For a relation the rules touch,
:meth:`Transforms.plan` gives what the encoders see instead of the real relation: dropped
columns gone, rewritten columns typed ``text`` (their values are text now), and the
function that rewrites a row's values.

A key must stay unique, or sinks merge distinct rows: only ``hash`` (an HMAC, injective in
practice) may apply to a key column. A rule that would rewrite a key column otherwise is
refused at start-up (:func:`check_catalog`), when a DDL event shows the table's new key
(:meth:`Transforms.ddl_columns`), and when the relation reaches the stream — the stream
stops with what to change rather than sending rows whose keys collide. Under REPLICA
IDENTITY FULL without a primary key the whole row is the key and not unique to begin
with: rules apply there as to any column.

Rules name columns, and a rename must not carry a column out from under its rule: every
shape a table reaches the stream in (a Relation message, a DDL event) is held against the
last one known, and a covered column that lost its rule stops the stream before anything
of that shape is sent (services/pg2kafka/transform_shapes.py); the stop is recorded, and
until a rule covers the column again under its new name pg2kafka refuses to start
(services/pg2kafka/transform_stops.py). At start-up :func:`check_catalog` refuses rules
that name what the catalog does not have. DDL events carry no statement text while rules
are configured (:data:`WITHHELD`): the text is all the client sent at once, literals of
protected columns included.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import Any

import orjson
import psycopg

from services.pg2kafka import pgoutput as pg
from services.pg2kafka import transform_stops
from services.pg2kafka.filters import INTERNAL_SCHEMA, TableFilter
from services.pg2kafka.settings import TransformRule, TransformSettings
from services.pg2kafka.transform_shapes import Shapes
from shared.errors import ConfigError, PermanentError
from shared.naming import wildcard

log = logging.getLogger(__name__)

TEXT_OID = 25
"""pg_type ``text``: what a rewritten column is typed as."""

Rewrite = Callable[[str], str | None]

WITHHELD = "<withheld: pg2kafka transform rules are configured>"
"""A DDL event's ``statement`` while transform rules are configured: ``current_query()``
is the client's whole query string, which may hold literals of protected columns (an
``UPDATE`` sent with the ``ALTER TABLE``) whatever table the DDL itself touched."""


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: TransformRule
    schema: re.Pattern[str]
    table: re.Pattern[str]
    column: re.Pattern[str]
    rewrite: Rewrite | None  # None: drop or null, which are no rewrite of the text

    def matches_table(self, schema: str, table: str) -> bool:
        return bool(self.schema.match(schema) and self.table.match(table))


@dataclass(frozen=True, slots=True)
class Plan:
    """One relation under the rules. ``relation``: what the encoders see (same oid,
    dropped columns gone, rewritten ones typed text); ``nulled``: columns set to NULL,
    which may then be NULL whatever the catalog says."""

    relation: pg.Relation
    steps: tuple[tuple[int, Rewrite | None], ...]  # (position, rewrite; None: NULL)
    keep: tuple[int, ...] | None  # positions left after drops; None: all
    nulled: frozenset[str]

    def apply(self, values: Sequence[Any]) -> tuple[Any, ...]:
        """A row's values (text, None for NULL, the unchanged-TOAST marker) rewritten:
        NULL and unchanged TOAST stay as they are."""
        out = list(values)
        for i, rewrite in self.steps:
            v = out[i]
            if v.__class__ is str:
                out[i] = None if rewrite is None else rewrite(v)
        if self.keep is not None:
            return tuple(out[i] for i in self.keep)
        return tuple(out)


# -- the actions ------------------------------------------------------------------------


def _digest(key: bytes, purpose: bytes, value: str) -> bytes:
    data = purpose + b"\0" + value.encode("utf-8", "surrogatepass")
    return hmac.new(key, data, hashlib.sha256).digest()


def _stream(key: bytes, purpose: bytes, value: str, n: int) -> bytes:
    """``n`` pseudo-random bytes determined by the key and the value (HMAC in counter mode)."""
    out = b""
    counter = 0
    while len(out) < n:
        out += _digest(key, purpose + counter.to_bytes(4, "big"), value)
        counter += 1
    return out[:n]


_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_ALNUM = _LETTERS + "0123456789"


def fake_email(key: bytes, value: str) -> str:
    """An address of the same shape: the local part and every domain label but the last
    replaced by as many letters and digits (the top-level domain stays, so the address
    still validates); the same input always gives the same address. Text without an
    ``@`` becomes a fake local part at ``example.invalid``."""
    local, at, domain = value.rpartition("@")
    if not at:
        rand = _stream(key, b"email", value, max(1, len(value)))
        return "".join(_ALNUM[b % len(_ALNUM)] for b in rand) + "@example.invalid"
    labels = domain.split(".")
    head = labels[:-1] if len(labels) > 1 else labels
    tail = labels[-1:] if len(labels) > 1 else []
    sizes = [max(1, len(local))] + [max(1, len(label)) for label in head]
    rand = _stream(key, b"email", value, sum(sizes))
    parts: list[str] = []
    pos = 0
    for i, size in enumerate(sizes):
        chars = _ALNUM if i == 0 else _LETTERS
        parts.append("".join(chars[b % len(chars)] for b in rand[pos : pos + size]))
        pos += size
    return parts[0] + "@" + ".".join(parts[1:] + tail)


def fake_phone(key: bytes, value: str) -> str:
    """The same number format — every digit replaced, everything else (``+``, spaces,
    dashes, brackets) kept — deterministic per input. A leading non-zero digit stays
    non-zero, so the fake reads as a number too."""
    digits = sum(c.isdigit() for c in value)
    rand = _stream(key, b"phone", value, max(1, digits))
    out: list[str] = []
    n = 0
    for c in value:
        if c.isdigit():
            d = rand[n] % 10
            if n == 0 and c != "0" and d == 0:
                d = 1 + rand[n] % 9
            out.append(str(d))
            n += 1
        else:
            out.append(c)
    return "".join(out)


def mask(value: str, keep: int, keep_from: str, char: str) -> str:
    """``keep`` characters kept at one end (never more than half the value, so a short
    value never comes out whole), the rest replaced one for one."""
    kept = min(keep, len(value) // 2)
    hidden = len(value) - kept
    if keep_from == "start":
        return value[:kept] + char * hidden
    return char * hidden + value[hidden:]


def rewrite_for(rule: TransformRule, key: bytes | None) -> Rewrite | None:
    """The text → text function of a rule; None for ``drop`` and ``null``."""
    action = rule.action
    if action in ("drop", "null"):
        return None
    if action == "mask":
        keep, end, char = rule.keep, rule.keep_from, rule.mask_char
        return lambda v: mask(v, keep, end, char)
    if action == "redact":
        constant = rule.value
        return lambda v: constant
    if action == "truncate":
        length = rule.length or 0
        return lambda v: v[:length]
    assert key is not None  # the settings refuse hash and fake rules without a key
    if action == "hash":
        return lambda v: hmac.new(
            key, v.encode("utf-8", "surrogatepass"), hashlib.sha256
        ).hexdigest()
    if rule.kind == "email":
        return lambda v: fake_email(key, v)
    return lambda v: fake_phone(key, v)


# -- the rules together -----------------------------------------------------------------


def _key_rule_error(rule: TransformRule, where: str) -> PermanentError:
    return PermanentError(
        f"transform rule {rule.column!r} ({rule.action}) matches {where}, a key column: keys"
        " must stay unique, and only hash keeps them so",
        hint="use action hash for that column, or narrow the rule's pattern so it leaves"
        " the key column out (rules apply in order: an earlier hash rule for the column wins)",
    )


def _compile(rule: TransformRule, key: bytes | None) -> _Compiled:
    schema, table, column = rule.column.split(".")
    return _Compiled(
        rule, wildcard(schema), wildcard(table), wildcard(column), rewrite_for(rule, key)
    )


class Transforms:
    """The configured rules, compiled. One per process; plans are computed per relation
    by their users (the event builders cache them with the relation)."""

    def __init__(self, settings: TransformSettings) -> None:
        key = settings.hash_key.get_secret_value().encode() if settings.hash_key else None
        self.rules = [_compile(r, key) for r in settings.rules]
        self._for_table = lru_cache(maxsize=4096)(self._table_rules)
        # The shapes tables were last seen in, against renames; shared by the process's
        # sessions (from_settings gives them one instance).
        self.shapes = Shapes(self.covered)

    def _table_rules(self, schema: str, table: str) -> tuple[_Compiled, ...]:
        if schema == INTERNAL_SCHEMA:
            return ()
        return tuple(r for r in self.rules if r.matches_table(schema, table))

    def rule_for(self, schema: str, table: str, column: str) -> _Compiled | None:
        for r in self._for_table(schema, table):
            if r.column.match(column):
                return r
        return None

    def touches(self, schema: str, table: str) -> bool:
        return bool(self._for_table(schema, table))

    def plan(self, rel: pg.Relation, unique: bool = True) -> Plan | None:
        """The relation under the rules, or None when none of its columns is touched.
        PermanentError when a rule other than ``hash`` matches one of its key columns
        (``is_key``) and the key is ``unique`` (see :func:`unique_key`)."""
        if not self.touches(rel.schema, rel.table):
            return None
        unique_key = unique
        steps: list[tuple[int, Rewrite | None]] = []
        keep: list[int] = []
        columns: list[pg.Column] = []
        nulled: set[str] = set()
        for i, col in enumerate(rel.columns):
            found = self.rule_for(rel.schema, rel.table, col.name)
            if found is None:
                keep.append(i)
                columns.append(col)
                continue
            action = found.rule.action
            if col.is_key and unique_key and action != "hash":
                raise _key_rule_error(found.rule, f"{rel.schema}.{rel.table}.{col.name}")
            if action == "drop":
                continue
            keep.append(i)
            if action == "null":
                steps.append((i, None))
                nulled.add(col.name)
                columns.append(col)
            else:
                steps.append((i, found.rewrite))
                columns.append(replace(col, type_oid=TEXT_OID, type_modifier=-1))
        if not steps and len(keep) == len(rel.columns):
            return None
        return Plan(
            relation=replace(rel, columns=tuple(columns)),
            steps=tuple(steps),
            keep=None if len(keep) == len(rel.columns) else tuple(keep),
            nulled=frozenset(nulled),
        )

    def ddl_columns(self, schema: str, table: str, columns: list[Any]) -> list[Any]:
        """A DDL event's column list as the rules leave the table (dropped columns gone,
        rewritten ones ``text``, NULLed ones nullable). (That no covered column lost its
        rule is :meth:`Shapes.check`'s, called first. Whether the table's key is still one
        the rules may touch is decided by :meth:`plan` when its first row after the change
        is built: the key of events is the replica identity, which the DDL message does
        not carry.)"""
        if not self.touches(schema, table):
            return columns
        names = {c.get("name") for c in columns if isinstance(c, dict)}
        for r in self._for_table(schema, table):
            exact = r.rule.column.split(".")[2]
            if "*" not in r.rule.column and exact not in names:
                log.warning(
                    "transform rule %r names a column %s.%s does not have: pg2kafka will"
                    " refuse to start until the rule is changed",
                    r.rule.column,
                    schema,
                    table,
                )
        out: list[Any] = []
        for c in columns:
            found = None
            if isinstance(c, dict):
                found = self.rule_for(schema, table, str(c.get("name")))
            if found is None:
                out.append(c)
            elif found.rule.action == "null":
                out.append({**c, "nullable": True})
            elif found.rule.action != "drop":
                out.append({**c, "type": "text", "sql_type": "text"})
        return out

    def covered(self, schema: str, table: str, names: Iterable[str]) -> dict[str, str]:
        """The columns of ``names`` a rule applies to, each with its rule's pattern."""
        out = {}
        for name in names:
            found = self.rule_for(schema, table, name)
            if found is not None:
                out[name] = found.rule.column
        return out

    def payload(self, doc: dict[str, Any]) -> bool:
        """A subscription payload's ``new`` / ``old`` row images rewritten in place by the
        rules of its table (``tg_table_schema``, ``tg_table_name``); True when something
        changed. The images hold JSON values (``to_jsonb``), not text outputs: a string is
        rewritten as it is, any other value as its JSON text, so a hash there may differ
        from the CDC event's for non-text columns. Values a subscription computes in
        ``payload_extensions`` are its author's: rules do not see them."""
        schema, table = doc.get("tg_table_schema"), doc.get("tg_table_name")
        if not isinstance(schema, str) or not isinstance(table, str):
            return False
        if not self.touches(schema, table):
            return False
        changed = False
        for image in ("new", "old"):
            row = doc.get(image)
            if not isinstance(row, dict):
                continue
            for name in list(row):
                found = self.rule_for(schema, table, name)
                if found is None:
                    continue
                changed = True
                value = row[name]
                if found.rule.action == "drop":
                    del row[name]
                elif value is None:
                    continue
                elif found.rewrite is None:
                    row[name] = None
                else:
                    text = value if isinstance(value, str) else _json_text(value)
                    row[name] = found.rewrite(text)
        return changed


def _json_text(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_PASSTHROUGH_SUBCLASS, default=str).decode()


def unique_key(rel: pg.Relation, primary_key: Callable[[int], list[str]] | None) -> bool:
    """Whether the key events carry for ``rel`` identifies one row: always, except under
    REPLICA IDENTITY FULL without a primary key (the whole row is the key, and rows may
    repeat). Under FULL with a primary key the builders key events by the primary key."""
    if rel.replica_identity != "f":
        return True
    return bool(primary_key(rel.oid)) if primary_key is not None else False


_SHARED: dict[int, tuple[TransformSettings, Transforms]] = {}
_SHARED_LOCK = threading.Lock()


def from_settings(settings: TransformSettings) -> Transforms | None:
    """The rules, or None when there are none (the encoders then do no per-row work).
    The same instance for the same settings object: the start-up check's catalog and the
    shapes one session saw serve the next (:meth:`Shapes.check`)."""
    if not settings.rules:
        return None
    with _SHARED_LOCK:
        hit = _SHARED.get(id(settings))
        if hit is not None and hit[0] is settings:
            return hit[1]
        made = Transforms(settings)
        if len(_SHARED) >= 64:
            del _SHARED[next(iter(_SHARED))]
        _SHARED[id(settings)] = (settings, made)
        return made


# -- at start-up ------------------------------------------------------------------------

_COLUMNS_SQL = """
SELECT n.nspname, c.relname, a.attname,
       coalesce(a.attnum = ANY (k.indkey::int2[]), false) AS is_key,
       c.relreplident = 'f' AND k.indkey IS NULL AS whole_row_key,
       c.oid::int8, a.attnum
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN LATERAL (
        SELECT i.indkey FROM pg_catalog.pg_index i
         WHERE i.indrelid = c.oid
           AND CASE c.relreplident WHEN 'i' THEN i.indisreplident
                                   WHEN 'n' THEN false ELSE i.indisprimary END
         LIMIT 1) k ON true
 WHERE c.relkind IN ('r', 'p')
   AND n.nspname NOT IN ('pg_catalog', 'information_schema')
   AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp%%'
 ORDER BY 1, 2, a.attnum
"""


@dataclass(frozen=True, slots=True)
class CatalogColumn:
    schema: str
    table: str
    column: str
    is_key: bool  # a column of the key events carry (primary key or identity index)
    oid: int = 0  # the table's
    attnum: int = 0  # the column's attribute number (0: unknown)


def catalog_columns(conn: psycopg.Connection[Any]) -> list[CatalogColumn]:
    rows = conn.execute(_COLUMNS_SQL).fetchall()
    return [
        CatalogColumn(str(s), str(t), str(c), bool(k) and not w, int(o), int(n))
        for s, t, c, k, w, o, n in rows
    ]


def check_catalog(
    transforms: Transforms, columns: Iterable[CatalogColumn], streamed: TableFilter
) -> dict[str, int]:
    """Every rule against the streamed tables' columns: ConfigError naming the first rule
    whose exact (wildcard-free) table or column does not exist, or that would rewrite a
    key column with anything but ``hash``. A wildcard rule matching nothing is logged (it
    may be meant for tables to come). Returns each rule's count of matched columns."""
    by_table: dict[tuple[str, str], list[CatalogColumn]] = {}
    for c in columns:
        if streamed.matches(c.schema, c.table):
            by_table.setdefault((c.schema, c.table), []).append(c)
    counts = {r.rule.column: 0 for r in transforms.rules}
    for (schema, table), cols in by_table.items():
        for col in cols:
            found = transforms.rule_for(schema, table, col.column)
            if found is None:
                continue
            counts[found.rule.column] += 1
            if col.is_key and found.rule.action != "hash":
                err = _key_rule_error(found.rule, f"{schema}.{table}.{col.column}")
                raise ConfigError(str(err))
    for r in transforms.rules:
        if counts[r.rule.column]:
            continue
        schema, table, column = r.rule.column.split(".")
        if "*" in schema or "*" in table or ("*" in column and (schema, table) not in by_table):
            log.warning("transform rule %r matches no column of a streamed table", r.rule.column)
            continue
        if (schema, table) not in by_table:
            raise ConfigError(
                f"transform rule {r.rule.column!r}: no streamed table {schema}.{table}"
                " (it does not exist, or filters leave it out)"
            )
        names = ", ".join(c.column for c in by_table[(schema, table)])
        # A wildcard for one table's columns that matches none of them is refused like an
        # exact name: after a rename took its column away, a restart must not stream on.
        hit = [c.column for c in by_table[(schema, table)] if r.column.match(c.column)]
        if hit:
            earlier = transforms.rule_for(schema, table, hit[0])
            shadow = earlier.rule.column if earlier is not None else "?"
            raise ConfigError(
                f"transform rule {r.rule.column!r} never applies: the earlier rule"
                f" {shadow!r} matches {schema}.{table}.{hit[0]} first",
                hint="put the more specific rule first (the first matching rule applies)",
            )
        raise ConfigError(
            f"transform rule {r.rule.column!r}: table {schema}.{table} has no column"
            f" {column!r} (its columns: {names})"
            if "*" not in column
            else f"transform rule {r.rule.column!r} matches no column of table"
            f" {schema}.{table} (its columns: {names})",
            hint="a column it was written for may have been renamed: name the new column"
            " (or remove the rule)",
        )
    return counts


def check_database(
    transforms: Transforms, conninfo: str, streamed: TableFilter, *, slot: str
) -> None:
    """:func:`check_catalog` against the database at ``conninfo``: run before a process
    leads or stands by, so a rule that names nothing stops it at start-up. Then the stops
    recorded for ``slot`` (services/pg2kafka/transform_stops.py): PermanentError while a
    column that lost its rule exists uncovered, or when ``init`` has not created their
    table. The catalog read becomes the first known shape of each table
    (:meth:`Shapes.remember_catalog`); from here on the process records its stops for
    ``slot``, checks the records again before each session's first shape, and reads a
    table's attribute numbers for each Relation message that shows a covered one."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        columns = catalog_columns(conn)
        counts = check_catalog(transforms, columns, streamed)
        # Read after the catalog: a transaction committed at or after this position is
        # not in what was read (see Shapes.check).
        row = conn.execute("SELECT pg_catalog.pg_current_wal_lsn()::text").fetchone()

    def guard() -> None:
        transform_stops.resolve(conninfo, slot, transforms.rule_for, streamed)

    guard()
    transforms.shapes.remember_catalog(
        [(c.oid, c.schema, c.table, c.column, c.attnum) for c in columns],
        streamed,
        pg.parse_lsn(str(row[0])) if row else 0,
    )
    transforms.shapes.recorder = partial(transform_stops.record, conninfo, slot)
    transforms.shapes.catalog = partial(transform_stops.columns, conninfo)
    transforms.shapes.guard = guard
    log.info("transform rules checked against the catalog", extra={"columns": counts})
