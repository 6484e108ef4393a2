"""``kafka2postgres verify`` / ``repair``: the target database compared with the source
(docs/design.md#verification), by the same code that reads the source.

The target is Postgres too, so its side (:class:`TargetDatabase`, a
:class:`~shared.verify.core.VerifyTarget`) is a :class:`~shared.verify.postgres.PostgresSource`
on the target database, told that each target table has its source table's shape (the
columns the stream carries, the key and its order): each range's count and sum of row
hashes is computed from the **values the target holds**, with the same hash expression
and text-output settings as on the source — not from a hash recorded on the way in. A
value changed in the target behind walcast's back differs like a value never delivered.
A row's ``xid`` (who wrote the version held: the judge's "changed since the read") is
the one ``_walcast_target.rows`` recorded. The marker: kafka2postgres's consumer group
commits offsets only after the target transaction that covers them committed
(:class:`~shared.verify.marks.GroupMarks`).

A repair's snapshot of key ranges ends with a ``range_end`` marker, which the applier
applies (:mod:`services.kafka2postgres.applier`): the rows held in those ranges below its
version go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import sql

from services.kafka2postgres.settings import Kafka2PostgresSettings
from services.kafka2postgres.statements import ROWS, TABLES, key_text
from services.kafka2postgres.tables import Tables
from shared.contract.keyorder import TEXT_KEY_TYPES
from shared.contract.rowhash import row_hash_sql
from shared.formats import debezium
from shared.verify.core import KeyRange, SinkRow, Summary, VerifyTarget
from shared.verify.marks import GroupMarks, avro_reader
from shared.verify.postgres import PostgresSource
from shared.verify.repair import RepairReport
from shared.verify.run import TableReport
from shared.verify.wiring import KeyShape, repair_once, verify_once


class TargetDatabase(VerifyTarget):
    """The target tables of the source database ``database``'s tables."""

    def __init__(
        self, settings: Kafka2PostgresSettings, database: str, key_shape: KeyShape
    ) -> None:
        self.s = settings
        self.database = database
        self.key_shape = key_shape
        v = settings.verify
        options = debezium.SESSION_OPTIONS if settings.consumer.input_format == "debezium" else ""
        self.source = PostgresSource(v.postgres.conninfo(), session_options=options)  # shapes
        self.target = PostgresSource(
            settings.target.postgres.conninfo(), rows_per_s=v.rows_per_s, session_options=options
        )
        self.names = Tables(settings.target)
        self.group = GroupMarks(
            settings.kafka.client_config(), settings.consumer.group_id, settings.consumer.topics,
            from_avro=avro_reader(settings.schema_registry),
        )  # fmt: skip

    def close(self) -> None:
        self.group.close()

    def _table(self, table: tuple[str, str]) -> tuple[tuple[str, str], int | None, tuple[str, ...]]:
        """The target table of ``table`` (as the source's shape, a text key always
        compared ``COLLATE "C"``: the target database's collation may order otherwise),
        its id in the bookkeeping (None: kafka2postgres holds nothing of it yet, every
        row missing) and its key as the bookkeeping writes it (the column order the
        table was made with)."""
        name = self.names.target_of((self.database, *table))
        shape = self.source.shape(table)
        c_order = tuple(t in TEXT_KEY_TYPES for t in shape.key_types)
        self.target.assume(name, replace(shape, partitioned=False, collate_c=c_order))
        with psycopg.connect(self.s.target.postgres.conninfo(), autocommit=True) as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT t.id, t.key FROM {} t WHERE t.source_db = %s"
                    " AND t.source_schema = %s AND t.source_table = %s"
                    " AND to_regclass(%s) IS NOT NULL"
                ).format(TABLES),
                [self.database, *table, sql.Identifier(*name).as_string(conn)],
            ).fetchone()
        if row is None:
            return name, None, shape.key
        return name, int(row[0]), tuple(row[1]) or shape.key

    def summaries(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[Summary]:
        name, tbl, _held = self._table(table)
        if tbl is None:
            return [Summary(0, 0) for _ in ranges]
        return [self.target.summary(name, rng) for rng in ranges]

    def rows(self, table: tuple[str, str], rng: KeyRange) -> list[SinkRow]:
        name, tbl, held = self._table(table)
        if tbl is None:
            return []
        key, _types = self.key_shape(table)
        source, where = self.target.selection(name, rng)
        columns = self.source.shape(table).columns
        # each row's hash from the values held, and who wrote the version held (0: none
        # recorded, as a snapshot's read row)
        query = sql.SQL(
            "SELECT {keys}, {h}, coalesce(v.xid, 0) FROM {src} LEFT JOIN {rows} v"
            " ON v.tbl = %s AND v.key = {text} WHERE {where}"
        ).format(
            keys=sql.SQL(", ").join(sql.Identifier("s", k) for k in key),
            h=row_hash_sql(columns, "s"), src=source, rows=ROWS, text=key_text("s", held),
            where=where,
        )  # fmt: skip
        n = len(key)
        with self.target.connect() as conn:
            got = conn.execute(query, [tbl]).fetchall()
        return [SinkRow(tuple(r[:n]), int(r[n]), int(r[n + 1])) for r in got]

    def before_mark(self, tables: Sequence[tuple[str, str]]) -> None:
        self.group.before_mark()

    def prefetch(self, table: tuple[str, str]) -> None:
        """Nothing: the summaries are one query per range, read after the marker."""

    def wait_for_mark(
        self, mark_id: str, tables: Sequence[tuple[str, str]], timeout_s: float
    ) -> None:
        self.group.wait_for_mark("kafka2postgres", mark_id, tables, timeout_s)


def _make(settings: Kafka2PostgresSettings) -> Callable[[str, KeyShape], TargetDatabase]:
    return lambda database, key_shape: TargetDatabase(settings, database, key_shape)


def verify(
    settings: Kafka2PostgresSettings,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[TableReport], None] | None = None,
) -> list[TableReport]:
    """Compare each table (every one the target holds when none is named) with Postgres."""
    chosen = list(tables) or held_tables(settings)
    return verify_once(settings.verify, "kafka2postgres", _make(settings), chosen, progress,
                       settings.consumer.input_format)  # fmt: skip


def repair(
    settings: Kafka2PostgresSettings,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[str], None] | None = None,
) -> list[RepairReport]:
    """Verify each table (every one the target holds when none is named) and have
    pg2kafka read again the key ranges that differ."""
    chosen = list(tables) or held_tables(settings)
    return repair_once(settings.verify, "kafka2postgres", _make(settings), chosen, progress,
                       settings.consumer.input_format)  # fmt: skip


def held_tables(settings: Kafka2PostgresSettings) -> list[tuple[str, str]]:
    """The source tables (schema, table) the target holds, of the verified database."""
    with psycopg.connect(settings.target.postgres.conninfo(), autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL(
                "SELECT source_schema, source_table FROM {} WHERE source_db = %s ORDER BY 1, 2"
            ).format(TABLES),
            [settings.verify.postgres.database],
        ).fetchall()
    return [(str(a), str(b)) for a, b in rows]
