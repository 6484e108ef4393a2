"""One micro-batch of change events into Delta: quarantine, changelog, per-table mirrors.

(Over 500 lines on purpose: every step below works on the same batch's persisted
DataFrames and the tables' Delta properties, in an order that is the correctness
argument; split, the order would have to be re-assembled by the reader.)

:class:`DeltaMirror` is the ``foreachBatch`` function of the streaming query. For each
batch of Kafka records it

1. parses every record against the envelope schema (:data:`schema.ENVELOPE`); records
   that are not change events go to the quarantine table with the raw bytes, the reason
   and the source offset, and the batch goes on;
2. appends every change event to the changelog table (partitioned by source table and
   commit date);
3. per source table, in LSN order: the truncate, DDL and snapshot marker events of the
   batch cut the data events into segments; each segment is reduced to the newest change
   per key (unchanged TOAST columns taken from an older change of the batch, or else kept
   from the table; a snapshot's ``read`` row is an insert) and MERGEd into the table's
   mirror; each truncate / DDL / snapshot end marker is applied between the segments
   around it, so the mirror follows the table's history; a segment's rows of an
   insert-only table (``append_only``, no key) are appended instead, once each by their
   row id (:mod:`services.kafka2spark.append_only`);
4. commits the batch's offsets to the Kafka consumer group (lag in standard tooling).

Idempotence — Spark runs a batch again after a crash, with the same records and id:

* appends (changelog, quarantine) use Delta's idempotent writes (``txnAppId`` +
  ``txnVersion`` = the batch id): a repeated append is skipped by Delta itself;
* the MERGE is guarded by the row's version (``_walcast_lsn``: the LSN, after the
  source's epoch — ``epoch * 2^48 + lsn``, docs/snapshots.md): a change not newer than the
  stored row changes nothing; a truncate records its LSN in the table's properties, so it
  is not applied twice and older changes stay out; a snapshot's end marker (version S)
  removes the rows older than S and records S - 1 there the same way, so the snapshot's
  rows (version S) still land after it;
* DDL compares the table's columns with the DDL's resulting columns, so a repeated DDL
  finds nothing left to do.

Column renames and drops rewrite the table (Delta without column mapping): column
mapping would make them metadata-only, but tables using it are not read correctly by
other Delta readers (the deltalake package returns nulls, still so with deltalake 1.6.6
and Delta 4.4), and a mirror must be readable everywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from services.kafka2spark import append_only
from services.kafka2spark.append_only import ROW_ID, W_ROW
from services.kafka2spark.held import add_mirror, read_held, read_mirrors, write_held
from services.kafka2spark.schema import ENVELOPE, spark_type
from services.kafka2spark.settings import Kafka2SparkSettings
from shared.avro import RegistryDecoder
from shared.contract import limits
from shared.contract.ddl import column_numbers
from shared.contract.ddl import renames as ddl_renames
from shared.contract.event import (
    CONTROL_OPS,
    DATA_OPS,
    EPOCH_SHIFT,
    EVENT_VERSION,
    MAX_EPOCH,
    MAX_EPOCH_LSN,
    UNFILLED,
)
from shared.contract.event import SNAPSHOT_PHASES as PHASES
from shared.formats.debezium_input import is_debezium
from shared.formats.debezium_input import translate as debezium_translate
from shared.naming import DELTA_DIRECTORY, table_name
from shared.settings import SchemaRegistrySettings

log = logging.getLogger(__name__)

LSN = "_walcast_lsn"  # the row's version: its LSN, after epoch * 2^48 (a new source)
SOURCE_LSN = "__source_lsn"  # the event's own lsn, for the changelog
TRUNCATED = "walcast.truncated_lsn"
SCHEMA_AT = "walcast.schema_at"  # "lsn:seq" of the last DDL applied
NUMBERS = "walcast.column_numbers"  # JSON: column -> attnum, to recognise renames
CORRUPT = "__w_corrupt"
TKEY = "__w_table"  # db.schema.table: what a mirror is per
# Working columns of a merge; the prefix keeps them apart from any Postgres column.
W_LSN, W_SEQ, W_OP, W_TOAST, W_PRESENT = "__w_lsn", "__w_seq", "__w_op", "__w_toast", "__w_has"
W_NEW, W_KEY, W_KAFKA, W_CARRY, W_KEEP, W_RANK, W_BEYOND = (
    "__w_new", "__w_key", "__w_", "__w_carry_", "__w_keep_", "__w_rank", "__w_beyond",
)  # fmt: skip
W_UNFILLED, W_SUPPLIED = "__w_unfilled", "__w_supplied"
_TEMPORAL = (T.DateType, T.TimestampType, T.TimestampNTZType)
_INFINITE = ("infinity", "-infinity")


def _parsed(raw: Column, t: T.DataType) -> Column:
    return raw.try_cast(t)


def _in_years(value: Column) -> Column:
    return (F.year(value) >= 1) & (F.year(value) <= 9999)


def _temporal(raw: Column, t: T.DataType) -> Column:
    """A date / timestamp from the event's text (docs/kafka2spark.md, "Values"):
    ``infinity`` / ``-infinity`` become the largest / smallest value every Delta reader
    holds (9999-12-31 23:59:59.999999, 0001-01-01); a year outside 1..9999 (BC, or
    ``+12345``) becomes NULL — counted, and exact in the changelog."""
    last = "9999-12-31" if isinstance(t, T.DateType) else "9999-12-31 23:59:59.999999"
    first = "0001-01-01" if isinstance(t, T.DateType) else "0001-01-01 00:00:00"
    parsed = _parsed(raw, t)
    return (
        F.when(raw == "infinity", F.lit(last).cast(t))
        .when(raw == "-infinity", F.lit(first).cast(t))
        .when(_in_years(parsed), parsed)
    )


def _unreadable(raw: Column, t: T.DataType) -> Column:
    """Text that is no date / timestamp at all: the change is quarantined."""
    return raw.isNotNull() & ~raw.isin(*_INFINITE) & _parsed(raw, t).isNull()


def _beyond(raw: Column, t: T.DataType) -> Column:
    parsed = _parsed(raw, t)
    return F.coalesce(parsed.isNotNull() & ~_in_years(parsed), F.lit(False))


_KAFKA_FIELDS = ("kafka_key", "kafka_value", "topic", "partition", "offset", "kafka_ts")


def quote(name: str) -> str:
    """A Spark SQL identifier, whatever the Postgres column is called."""
    return "`" + name.replace("`", "``") + "`"


# Characters Delta refuses in column names without column mapping, and the escape itself.
_DELTA_REFUSES = frozenset(" ,;{}()\n\t=%")


def _escape(ch: str) -> str:
    return "".join(f"%{b:02X}" for b in ch.encode())


def column_name(name: str) -> str:
    """The mirror's usual name for a Postgres column: the same name when Delta accepts
    it, else each refused character (`` ,;{}()\\n\\t=``) and ``%`` as ``%XX``
    (``first name`` → ``first%20name``); a name that is walcast's own in any case
    (``_walcast_lsn``, ``__w_...``) gets a leading ``%``. Reversible (:func:`postgres_name`).
    A column whose usual name a case twin already holds gets another (:func:`mirror_names`),
    so the mirror's own schema is what maps a column to its name. Delta's column mapping
    would allow any name, but the ``deltalake`` reader returned nulls for such tables;
    Spark, delta-rs and every other reader read these names as they are."""
    if not _DELTA_REFUSES.intersection(name) and not _walcast_own(name):
        return name
    out = "".join(_escape(ch) if ch in _DELTA_REFUSES else ch for ch in name)
    return "%" + out if _walcast_own(out) else out


def _case_escaped(name: str) -> str:
    """:func:`column_name`'s escape applied to every cased letter and non-ASCII character
    too: only digits, punctuation and ``%XX`` stay, so no other column's mirror name is
    equal to it case-insensitively."""
    return "".join(
        _escape(ch) if ch in _DELTA_REFUSES or not ch.isascii() or ch.upper() != ch.lower() else ch
        for ch in name
    )


def _folded(name: str) -> str:
    """A column name as Spark and Delta compare it: case-insensitively (Spark resolves
    names ignoring case, and Delta refuses two columns that differ only by case)."""
    return name.upper().casefold()


def mirror_names(taken: list[str], columns: list[str]) -> dict[str, str]:
    """Mirror names for Postgres columns new to a mirror whose columns are named ``taken``
    (mirror names): :func:`column_name`, unless Delta would see it as equal to a taken
    one or an earlier new one (case twins, ``"Name"`` beside ``name``): then the case-free
    :func:`_case_escaped` form. Either decodes back with :func:`postgres_name`. The order
    of ``columns`` decides which twin keeps the plain name: callers pass Postgres' column
    order."""
    seen = {_folded(t) for t in taken} | {_folded(LSN), _folded(ROW_ID), _folded(UNFILLED)}
    out: dict[str, str] = {}
    for c in columns:
        name = column_name(c)
        if _folded(name) in seen:
            name = _case_escaped(c)
        if _folded(name) in seen:  # cannot happen for a name not already in the mirror
            raise MirrorError(f"column {c!r} has no mirror name free of its case twins")
        seen.add(_folded(name))
        out[c] = name
    return out


def postgres_name(name: str) -> str:
    """The Postgres column a mirror column holds: the inverse of :func:`column_name` and
    :func:`mirror_names`."""
    if "%" not in name:
        return name
    if name.startswith("%") and _walcast_own(name[1:]):
        name = name[1:]
    return unquote(name, errors="strict")


def _walcast_own(name: str) -> bool:
    folded = _folded(name)
    return folded in (LSN, ROW_ID, UNFILLED) or folded.startswith("__w_")


def table_dir(template: str, db: str, schema: str, table: str) -> str:
    """The mirror's directory name: collision-free (:func:`shared.naming.table_name`)."""
    return table_name(template, DELTA_DIRECTORY, db, schema, table)


@dataclass
class BatchResult:
    """What one batch did (logged, exported as metrics, returned to tests)."""

    batch_id: int
    records: int = 0
    quarantined: int = 0
    events: int = 0
    merged: dict[str, int] = field(default_factory=dict)  # table -> source rows merged
    # table -> changes without key values, never merged (a keyed mirror has no NULL keys)
    keyless: dict[str, int] = field(default_factory=dict)
    # table -> its events quarantined because the table is held (its mirror failed)
    held: dict[str, int] = field(default_factory=dict)
    # table -> date / timestamp values outside years 1..9999, stored as NULL
    beyond: dict[str, int] = field(default_factory=dict)
    schema_changes: list[str] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # last offset read
    first_ts: float | None = None  # the oldest Kafka timestamp read (epoch seconds)
    seconds: float = 0.0
    # Where the batch's time went: read, quarantine, changelog, plan, "table <name>"
    # (its merges, truncates and DDL), commit (added by the caller).
    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - started

    def breakdown(self) -> str:
        """The phases, slowest first, as ``changelog 2.1s, table public.a 5.3s, ...``."""
        ordered = sorted(self.phases.items(), key=lambda kv: -kv[1])
        return ", ".join(f"{name} {sec:.1f}s" for name, sec in ordered)


@dataclass
class _Control:
    table: str
    lsn: int
    seq: int
    op: str
    ddl: dict[str, Any] | None
    event: dict[str, str]
    snapshot: dict[str, Any] | None = None


class DeltaMirror:
    """The ``foreachBatch`` function: ``mirror(df, batch_id)``.

    ``on_batch(result)`` runs after everything of the batch is written (metrics, the
    Kafka group commit); an exception from it fails the batch like any other, and Spark
    runs it again on restart.
    """

    def __init__(
        self,
        spark: SparkSession,
        settings: Kafka2SparkSettings,
        on_batch: Callable[[BatchResult], None] = lambda _r: None,
    ) -> None:
        self.spark = spark
        self.s = settings
        self.root = settings.delta.root
        self.on_batch = on_batch
        self._app_id: str | None = None
        self.beyond: dict[str, int] = {}  # table -> dates beyond 1..9999 stored as NULL
        self.mirrors: set[str] = read_mirrors(self.root)  # db.schema.table created here
        self._creating = ""

    @property
    def app_id(self) -> str:
        """Names this query's idempotent appends: the query id Spark keeps in its
        checkpoint (a new checkpoint restarts batch ids at 0 under a new id, so nothing
        is skipped); without a checkpoint (a batch fed by hand), the checkpoint path."""
        if self._app_id is None:
            checkpoint = self.s.delta.checkpoint_path()
            try:
                query_id = json.loads((checkpoint / "metadata").read_text())["id"]
            except (OSError, ValueError, KeyError):
                query_id = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:16]
            self._app_id = f"walcast-kafka2spark-{query_id}"
        return self._app_id

    # -- paths ---------------------------------------------------------------------------

    def path_of(self, db: str, schema: str, table: str) -> Path:
        return self.root / table_dir(self.s.delta.table_template, db, schema, table)

    @property
    def changelog_path(self) -> Path:
        return self.root / self.s.delta.changelog_table

    @property
    def quarantine_path(self) -> Path:
        return self.root / self.s.delta.quarantine_table

    # -- the batch -----------------------------------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        result = BatchResult(batch_id)
        self.beyond = result.beyond
        raw = df.select(
            "key", "value", "topic", "partition", "offset", F.col("timestamp").alias("kafka_ts")
        )
        registry = self.s.schema_registry if self.s.schema_registry.url else None
        if self.s.source.input_format != "walcast" or registry is not None:
            # Translated before it is cached: the cache holds walcast's events, not the
            # Debezium records (several times larger with their schemas).
            raw = translate(raw, self.s.source.input_format, registry)
        raw = raw.persist()
        try:
            with result.phase("read"):
                for row in (
                    raw.groupBy("topic", "partition")
                    .agg(F.max("offset").alias("o"), F.min("kafka_ts").alias("ts"))
                    .collect()
                ):
                    result.offsets[(row["topic"], row["partition"])] = int(row["o"])
                    if row["ts"] is not None:  # a naive local datetime: .timestamp() inverts it
                        ts = row["ts"].timestamp()
                        first = result.first_ts
                        result.first_ts = ts if first is None else min(first, ts)
                if result.offsets:
                    result.records = raw.count()
            if result.offsets:
                self._batch(raw, batch_id, result)
        finally:
            raw.unpersist()
        result.seconds = time.monotonic() - started
        self.on_batch(result)

    def _batch(self, raw: DataFrame, batch_id: int, result: BatchResult) -> None:
        untranslatable: DataFrame | None = None
        if "t" in raw.columns:  # translated input (see translate)
            untranslatable = raw.where(F.col("t.reason").isNotNull()).select(
                "key", "value", F.col("t.reason").alias("reason"), *_ORIGIN
            )
            raw = raw.where(F.col("t.reason").isNull()).select(
                "key", F.explode("t.values").alias("value"), *_ORIGIN
            )
        # Persisted once parsed: the quarantine's count and every later step read the
        # parsed records, not the JSON again (the quarantine check alone took ~13% of a
        # batch when each step parsed anew).
        parsed = (
            raw.withColumn("e", F.from_json(F.col("value").cast("string"), ENVELOPE))
            .withColumn("reason", _reason())
            .persist()
        )
        bad = parsed.where(F.col("reason").isNotNull())
        if untranslatable is not None:
            bad = bad.select("key", "value", "reason", *_ORIGIN).unionByName(untranslatable)
        events = parsed.where(F.col("reason").isNull())
        events = events.select(
            "e.*",
            "topic",
            "partition",
            "offset",
            "kafka_ts",
            F.col("key").alias("kafka_key"),  # the envelope has a "key" of its own
            F.col("value").alias("kafka_value"),
        ).withColumns(
            {
                "source_table": F.concat_ws(".", "schema", "table"),
                TKEY: F.concat_ws(".", "db", "schema", "table"),
                # From here on ``lsn`` is the row's version: the epoch before the LSN
                # (shared.contract.event.version); the changelog keeps both as sent.
                SOURCE_LSN: F.col("lsn"),
                "lsn": F.col("lsn")
                + F.coalesce(F.col("epoch"), F.lit(0)).cast("long") * F.lit(2**EPOCH_SHIFT),
            }
        )
        try:
            with result.phase("quarantine"):
                result.quarantined = self._quarantine(bad, batch_id, "records")
            with result.phase("changelog"):
                result.events = self._changelog(events, batch_id)
            if result.events:
                self._mirror(events, batch_id, result)
        finally:
            parsed.unpersist()

    # -- quarantine and changelog --------------------------------------------------------

    def _append(self, df: DataFrame, path: Path, app: str, batch_id: int, **kw: Any) -> None:
        """An idempotent append: Delta skips it if (app, batch_id) was already written."""
        writer = (
            df.write.format("delta")
            .mode("append")
            .option("txnAppId", f"{self.app_id}-{app}")
            .option("txnVersion", batch_id)
            .option("mergeSchema", "true")
        )
        if kw.get("partition_by"):
            writer = writer.partitionBy(*kw["partition_by"])
        writer.save(str(path))

    def _quarantine(self, bad: DataFrame, batch_id: int, app: str) -> int:
        rows = bad.select(
            "key",
            "value",
            "reason",
            "topic",
            "partition",
            "offset",
            "kafka_ts",
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.current_timestamp().alias("quarantined_at"),
        ).persist()
        try:
            n = rows.count()
            if n:
                self._append(rows, self.quarantine_path, f"quarantine-{app}", batch_id)
                for r in rows.select("topic", "partition", "offset", "reason").limit(20).collect():
                    log.warning(
                        "quarantined %s[%d]@%d: %s",
                        r["topic"], r["partition"], r["offset"], r["reason"],
                    )  # fmt: skip
            return n
        finally:
            rows.unpersist()

    def _changelog(self, events: DataFrame, batch_id: int) -> int:
        ts = F.to_timestamp("commit_ts")
        rows = events.select(
            "source_table",
            F.to_date(ts).alias("commit_date"),
            "op", "db", "schema", "table", F.col(SOURCE_LSN).alias("lsn"), "seq", "commit_lsn",
            "xid",
            ts.alias("commit_ts"),
            "key", "new", "old", "unchanged_toast", "types",
            F.to_json("ddl").alias("ddl"),
            "topic", "partition", "offset", "kafka_ts",
            F.to_json("snapshot").alias("snapshot"),
            F.coalesce(F.col("epoch"), F.lit(0)).alias("epoch"),
            "append_only",
        )  # fmt: skip
        n = rows.count()
        if n:
            self._append(
                rows,
                self.changelog_path,
                "changelog",
                batch_id,
                partition_by=["source_table", "commit_date"],
            )
        return n

    # -- mirrors -------------------------------------------------------------------------

    def _mirror(self, events: DataFrame, batch_id: int, result: BatchResult) -> None:
        with result.phase("plan"):
            controls, data, tables, key_cols, keyless = self._plan(events)
        try:
            held = self.held()
            for name in sorted(set(tables) | set(controls)):
                ctl = controls.get(name, [])
                t = tables.get(name)
                ids = t["ids"] if t else tuple(ctl[0].event[k] for k in ("db", "schema", "table"))
                path = self.path_of(*ids)
                label = f"{ids[1]}.{ids[2]}"
                if name in held:
                    self._hold(events, name, label, held[name]["reason"], batch_id, result)
                    continue
                try:
                    with result.phase(f"table {label}"):
                        self._table(
                            path, label, name, t, ctl, data, key_cols, keyless, batch_id, result
                        )
                except Exception as exc:
                    if not _table_failure(exc):
                        raise  # not this table's: the batch fails and runs again
                    reason = f"{label} held after a failure: {_first_line(exc)}"
                    held[name] = {"reason": reason, "batch_id": batch_id}
                    self._save_held(held)
                    log.error(
                        "%s; its changes go to the quarantine from this batch on, the other"
                        " tables go on. Fix the cause, then release it (`kafka2spark release"
                        " --table %s`) and bring its rows back (re-snapshot, or replay)",
                        reason,
                        name,
                    )
                    self._hold(events, name, label, reason, batch_id, result)
        finally:
            data.unpersist()

    def _plan(
        self, events: DataFrame
    ) -> tuple[
        dict[str, list[_Control]],
        DataFrame,
        dict[str, dict[str, Any]],
        dict[tuple[str, int], list[str]],
        dict[tuple[str, int], int],
    ]:
        """The batch's control events per table, its data events cut into segments by
        them (persisted: the caller unpersists), and per (table, segment) the column
        types and key columns — three small Spark jobs."""
        controls = [
            _Control(
                r[TKEY],
                int(r["lsn"]),
                int(r["seq"] or 0),
                r["op"],
                r["ddl"].asDict(recursive=True) if r["ddl"] is not None else None,
                {"db": r["db"], "schema": r["schema"], "table": r["table"]},
                r["snapshot"].asDict() if r["snapshot"] is not None else None,
            )
            for r in events.where(F.col("op").isin(*CONTROL_OPS))
            .select(TKEY, "lsn", "seq", "op", "ddl", "db", "schema", "table", "snapshot")
            .collect()
        ]
        controls.sort(key=lambda c: (c.table, c.lsn, c.seq))
        by_table: dict[str, list[_Control]] = {}
        for c in _distinct(controls):
            by_table.setdefault(c.table, []).append(c)

        # Only events that change the mirror cut its rows into segments (a segment is one
        # MERGE): a snapshot's start, or a table's drop, merely recorded, do not.
        cutting = {t: [c for c in ctl if _cuts(c)] for t, ctl in by_table.items()}
        data = events.where(F.col("op").isin(*DATA_OPS)).withColumn(
            "segment", _segment_expr(cutting)
        )
        data = data.persist()
        try:
            # Per (table, segment): each column's newest type and the newest LSN carrying
            # it, and the key columns — two small jobs.
            shape = (
                data.select(
                    TKEY,
                    "segment",
                    "db",
                    "schema",
                    "table",
                    F.explode_outer("types").alias("column", "type"),
                    F.col("lsn"),
                )
                .groupBy(TKEY, "segment", "db", "schema", "table", "column")
                .agg(F.max_by("type", "lsn").alias("type"), F.max("lsn").alias("newest"))
                .collect()
            )
            names = F.map_keys(F.from_json("key", "map<string,string>"))
            no_key = F.coalesce(F.size("k"), F.lit(0)) <= 0  # "a": an insert-only table's row
            keys = (
                data.select(TKEY, "segment", names.alias("k"), append_only.chosen().alias("a"))
                .groupBy(TKEY, "segment")
                .agg(
                    F.array_distinct(F.flatten(F.collect_set("k"))).alias("k"),
                    F.sum(F.when(no_key & ~F.col("a"), 1).otherwise(0)).alias("keyless"),
                    F.sum(F.when(F.col("a"), 1).otherwise(0)).alias("appended"),
                )
                .collect()
            )
            tables: dict[str, dict[str, Any]] = {}
            for r in shape:
                info = tables.setdefault(
                    r[TKEY], {"ids": (r["db"], r["schema"], r["table"]), "segments": {}}
                )
                seg = info["segments"].setdefault(int(r["segment"]), {})
                if r["column"] is not None:
                    seg[r["column"]] = (r["type"], int(r["newest"]))
            key_cols: dict[tuple[str, int], list[str]] = {}
            keyless: dict[tuple[str, int], int] = {}
            for r in keys:
                key_cols[(r[TKEY], int(r["segment"]))] = list(r["k"] or [])
                keyless[(r[TKEY], int(r["segment"]))] = int(r["keyless"] or 0)
                if r["appended"] and r[TKEY] in tables:  # rows of an insert-only table
                    tables[r[TKEY]].setdefault("appended", set()).add(int(r["segment"]))
            return by_table, data, tables, key_cols, keyless
        except BaseException:
            data.unpersist()
            raise

    def _table(
        self,
        path: Path,
        label: str,
        name: str,
        t: dict[str, Any] | None,
        ctl: list[_Control],
        data: DataFrame,
        key_cols: dict[tuple[str, int], list[str]],
        keyless: dict[tuple[str, int], int],
        batch_id: int,
        result: BatchResult,
    ) -> None:
        """One table's part of the batch: its segments merged, its truncates and DDL
        applied between them, in LSN order."""
        self._creating = name  # the key _create registers a new mirror under
        if name in self.mirrors and not self._exists(path):
            raise MirrorError(
                f"the mirror of {label} at {path} was deleted outside walcast: its rows are"
                " gone (creating it again would leave a partial copy)"
            )
        seg = 0
        for c in ctl:
            if _cuts(c):  # the rows before it first
                self._segment(path, label, name, t, seg, data, key_cols, keyless, batch_id, result)
                seg += 1
            change = self._control(path, label, c)
            if change:
                result.schema_changes.append(change)
        self._segment(path, label, name, t, seg, data, key_cols, keyless, batch_id, result)

    def _segment(
        self,
        path: Path,
        label: str,
        name: str,
        t: dict[str, Any] | None,
        seg: int,
        data: DataFrame,
        key_cols: dict[tuple[str, int], list[str]],
        keyless: dict[tuple[str, int], int],
        batch_id: int,
        result: BatchResult,
    ) -> None:
        """Merge the table's rows of segment ``seg`` (between two control events)."""
        if t is None or seg not in t["segments"]:
            return
        rows = data.where((F.col(TKEY) == name) & (F.col("segment") == seg))
        key = sorted(key_cols.get((name, seg), []))
        appended = seg in t.get("appended", ())
        merged = 0
        if key or not appended:  # keyed rows (or keyless ones, warned about)
            merged = self._merge(path, label, rows, t["segments"][seg], key, batch_id, seg)
        if appended:  # rows of an insert-only table: appended once each
            merged += self._merge(
                path, label, rows, t["segments"][seg], [], batch_id, seg, appending=True
            )
        result.merged[label] = result.merged.get(label, 0) + merged
        skipped = keyless.get((name, seg), 0)
        if skipped:
            result.keyless[label] = result.keyless.get(label, 0) + skipped
            log.warning(
                "%s: %d changes without key values not mirrored (sent while"
                " the table had no primary key or replica identity)",
                label,
                skipped,
            )

    # -- held tables -------------------------------------------------------------------

    def held(self) -> dict[str, dict[str, Any]]:
        return read_held(self.root)

    def _save_held(self, held: dict[str, dict[str, Any]]) -> None:
        write_held(self.root, held)

    def _hold(
        self,
        events: DataFrame,
        name: str,
        label: str,
        reason: str,
        batch_id: int,
        result: BatchResult,
    ) -> None:
        """A held table's events of this batch go to the quarantine (with the reason),
        so none is lost and none is applied out of order after the ones that failed."""
        rows = events.where(F.col(TKEY) == name).select(
            F.col("kafka_key").alias("key"),
            F.col("kafka_value").alias("value"),
            F.lit(reason).alias("reason"),
            "topic",
            "partition",
            "offset",
            "kafka_ts",
        )
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        n = self._quarantine(rows, batch_id, f"held-{digest}")
        result.held[label] = result.held.get(label, 0) + n

    # -- table state ---------------------------------------------------------------------

    def _exists(self, path: Path) -> bool:
        return (path / "_delta_log").is_dir() and any((path / "_delta_log").glob("*.json"))

    def _columns(self, path: Path) -> dict[str, T.StructField]:
        """The mirror's columns (field name = mirror name, :func:`mirror_names`) by their
        Postgres names, without walcast's own ``_walcast_lsn``."""
        df = self.spark.read.format("delta").load(str(path))
        own = (LSN, ROW_ID, UNFILLED)
        return {postgres_name(f.name): f for f in df.schema.fields if f.name not in own}

    def _properties(self, path: Path) -> dict[str, str]:
        rows = self.spark.sql(f"SHOW TBLPROPERTIES delta.{quote(str(path))}").collect()
        return {r["key"]: r["value"] for r in rows}

    def _set_property(self, path: Path, key: str, value: str) -> None:
        literal = value.replace("\\", "\\\\").replace("'", "\\'")  # column names may hold '
        self.spark.sql(
            f"ALTER TABLE delta.{quote(str(path))} SET TBLPROPERTIES ('{key}' = '{literal}')"
        )

    def _schema_position(self, path: Path) -> tuple[int, int]:
        """(lsn, seq) of the last DDL applied to the mirror."""
        lsn, _, seq = self._properties(path).get(SCHEMA_AT, "0:0").partition(":")
        return int(lsn), int(seq or 0)

    def _create(
        self, path: Path, name: str, types: dict[str, str], key: list[str], appending: bool = False
    ) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(self.spark).location(str(path))
        names = mirror_names([], list(types))
        for column, pg in types.items():
            builder = builder.addColumn(names[column], spark_type(pg))
        builder = builder.addColumn(LSN, T.LongType())
        if appending:  # an insert-only table: its rows' ids (services.kafka2spark.append_only)
            builder = builder.addColumn(ROW_ID, T.StringType())
        builder = (
            builder.property("walcast.source", name)
            .property("walcast.key", ",".join(key))
            .property(TRUNCATED, "0")
            .property(SCHEMA_AT, "0:0")
        )
        builder.execute()
        add_mirror(self.root, self._creating)
        self.mirrors.add(self._creating)
        log.info("created the mirror of %s at %s", name, path)

    def _add_columns(self, path: Path, taken: list[str], new: dict[str, str]) -> None:
        names = mirror_names(taken, list(new))
        cols = ", ".join(
            f"{quote(names[c])} {spark_type(t).simpleString()}" for c, t in new.items()
        )
        self.spark.sql(f"ALTER TABLE delta.{quote(str(path))} ADD COLUMNS ({cols})")

    # -- merge ---------------------------------------------------------------------------

    def _merge(
        self,
        path: Path,
        name: str,
        rows: DataFrame,
        types: dict[str, tuple[str, int]],
        key: list[str],
        batch_id: int,
        segment: int,
        appending: bool = False,
    ) -> int:
        """MERGE a segment's keyed rows by ``key``; with ``appending``, its rows of an
        insert-only table, by their row id (:mod:`services.kafka2spark.append_only`)."""
        if not key and not appending:
            log.warning("%s has no primary key or replica identity: not mirrored", name)
            return 0
        if not self._exists(path):
            # sorted: which case twin keeps the plain name must not depend on the batch
            self._create(path, name, {c: types[c][0] for c in sorted(types)}, key, appending)
        elif appending:
            append_only.ensure_column(self.spark, path)
        current = self._columns(path)
        schema_lsn, _ = self._schema_position(path)
        # A column the mirror lacks is added — unless only changes older than the last
        # DDL carry it (a column that DDL renamed or dropped, seen again on a replay).
        new = {
            c: types[c][0] for c in sorted(types) if c not in current and types[c][1] > schema_lsn
        }
        if new:
            self._add_columns(path, [f.name for f in current.values()], new)
            current = self._columns(path)
        missing = [k for k in key if k not in current]
        if missing:
            raise MirrorError(f"{name}: key columns {missing} are not in the mirror at {path}")
        truncated = int(self._properties(path).get(TRUNCATED, "0"))
        columns = list(current)
        names = {c: f.name for c, f in current.items()}
        # Dates and timestamps are read as text and converted here (_temporal): Postgres'
        # infinity and years outside 1..9999 would fail the parse and quarantine the row.
        temporal = {c: f.dataType for c, f in current.items() if isinstance(f.dataType, _TEMPORAL)}

        def parsed(cols: list[str], field_name: Callable[[str], str]) -> list[T.StructField]:
            return [
                T.StructField(
                    field_name(c), T.StringType() if c in temporal else current[c].dataType
                )
                for c in cols
            ]

        # JSON is matched to Postgres names (case-sensitively); the struct is then cast,
        # by position, to mirror names, which Spark can tell apart (case twins).
        corrupt_field = T.StructField(CORRUPT, T.StringType())
        row_type = T.StructType([*parsed(columns, str), corrupt_field])
        row_named = T.StructType([*parsed(columns, names.__getitem__), corrupt_field])
        key_type = T.StructType(parsed(key, str))
        key_named = T.StructType(parsed(key, names.__getitem__))
        # A change without key values (sent before the table had its key) cannot be
        # placed in a keyed mirror: merged, it would be a row with NULL keys.
        has_key = F.coalesce(F.size(F.map_keys(F.from_json("key", "map<string,string>"))), F.lit(0))
        which = append_only.chosen() if appending else (has_key > 0) & ~append_only.chosen()
        ids = [append_only.row_id().alias(W_ROW)] if appending else []
        src = rows.where((F.col("lsn") > truncated) & which).select(
            F.col("lsn").alias(W_LSN),
            F.col("seq").alias(W_SEQ),
            F.col("op").alias(W_OP),
            F.coalesce("unchanged_toast", F.array().cast("array<string>")).alias(W_TOAST),
            F.coalesce(F.json_object_keys("new"), F.array().cast("array<string>")).alias(W_PRESENT),
            F.from_json(
                "new", row_type, {"columnNameOfCorruptRecord": CORRUPT, "mode": "PERMISSIVE"}
            )
            .cast(row_named)
            .alias(W_NEW),
            *([F.from_json("key", key_type).cast(key_named).alias(W_KEY)] if key else ids),
            *[F.col(c).alias(f"{W_KAFKA}{c}") for c in _KAFKA_FIELDS],
        )
        raw = {c: F.col(f"{W_KEY if c in key else W_NEW}.{quote(names[c])}") for c in columns}
        unreadable = [
            F.when(_unreadable(raw[c], t), F.lit(f"column {c}: not a {t.simpleString()}"))
            for c, t in temporal.items()
        ]
        beyond = [_beyond(raw[c], t).cast("int") for c, t in temporal.items()]
        if appending:
            unreadable.append(F.when(F.col(W_ROW).isNull(), F.lit(append_only.NO_ROW_ID)))
        src = src.select(
            W_LSN,
            W_SEQ,
            W_OP,
            W_TOAST,
            W_PRESENT,
            *([W_ROW] if appending else []),
            F.coalesce(F.col(f"{W_NEW}.{quote(CORRUPT)}"), *unreadable).alias(CORRUPT),
            *[
                (_temporal(raw[c], temporal[c]) if c in temporal else raw[c]).alias(names[c])
                for c in columns
            ],
            (sum(beyond[1:], beyond[0]) if beyond else F.lit(0)).alias(W_BEYOND),
            *[f"{W_KAFKA}{c}" for c in _KAFKA_FIELDS],
        ).persist()
        try:
            if temporal:
                (n,) = src.agg(F.sum(W_BEYOND)).first() or (0,)
                if n:
                    self.beyond[name] = self.beyond.get(name, 0) + int(n)
                    log.warning(
                        "%s: %d date/time values outside years 1..9999 stored as NULL (the"
                        " changelog keeps the exact text)",
                        name,
                        n,
                    )
            # A value Spark cannot convert to the column's type is not merged as null: the
            # change goes to the quarantine with the reason, the rest of the batch goes on.
            corrupt = src.where(F.col(CORRUPT).isNotNull()).select(
                F.col(f"{W_KAFKA}kafka_key").alias("key"),
                F.col(f"{W_KAFKA}kafka_value").alias("value"),
                F.concat(
                    F.lit(f"a value does not fit the column types of {name}: "), F.col(CORRUPT)
                ).alias("reason"),
                *[F.col(f"{W_KAFKA}{c}").alias(c) for c in ("topic", "partition", "offset")],
                F.col(f"{W_KAFKA}kafka_ts").alias("kafka_ts"),
            )
            app = f"values-{path.name}-{segment}{'-appended' if appending else ''}"
            self._quarantine(corrupt, batch_id, app)
            good = src.where(F.col(CORRUPT).isNull())
            if appending:
                return append_only.append_rows(self.spark, path, good, names)
            return self._merge_good(path, good, names, key)
        finally:
            src.unpersist()

    def _merge_good(self, path: Path, src: DataFrame, names: dict[str, str], key: list[str]) -> int:
        """Newest change per key; each column from the newest change that supplied it
        (an update leaves out unchanged TOAST values, and a change older than a DDL lacks
        the columns it added), else the stored value. ``names``: Postgres name → mirror
        name of every column."""
        from delta.tables import DeltaTable

        columns = list(names)

        def mq(c: str) -> str:
            return quote(names[c])

        by_key = [F.col(mq(k)) for k in key]
        running = (
            Window.partitionBy(*by_key)
            .orderBy(W_LSN, W_SEQ)
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        values = [c for c in columns if c not in key]
        for i, c in enumerate(values):
            supplied = (
                (F.col(W_OP) != "delete")
                & F.array_contains(W_PRESENT, c)
                & ~F.array_contains(W_TOAST, c)  # Postgres names, as the event has them
            )
            carried = F.last(F.when(supplied, F.struct(F.col(mq(c)).alias("v"))), True)
            src = src.withColumn(f"{W_CARRY}{i}", carried.over(running))
        keep = [F.col(f"{W_CARRY}{i}").isNull() for i in range(len(values))]
        # Unfilled (shared.contract.event.fill_unfilled): TOAST columns the newest change
        # left out and no change of the batch supplied — the stored row's value, or none.
        lacking = [
            F.when(k & F.array_contains(W_TOAST, c), F.lit(c))
            for k, c in zip(keep, values, strict=True)
        ]
        src = src.select(
            W_LSN,
            W_SEQ,
            W_OP,
            *[F.col(mq(k)) for k in key],
            *[F.col(f"{W_CARRY}{i}.v").alias(names[c]) for i, c in enumerate(values)],
            *[k.alias(f"{W_KEEP}{i}") for i, k in enumerate(keep)],
            _names(lacking).alias(W_UNFILLED),
            # the columns this row supplies: what it fills in a held row (fill_unfilled)
            _names([F.when(~k, F.lit(c)) for k, c in zip(keep, values, strict=True)]).alias(
                W_SUPPLIED
            ),
        )
        newest = Window.partitionBy(*by_key).orderBy(F.col(W_LSN).desc(), F.col(W_SEQ).desc())
        src = (
            src.withColumn(W_RANK, F.row_number().over(newest)).where(F.col(W_RANK) == 1)
        ).persist()
        try:
            table = DeltaTable.forPath(self.spark, str(path))
            unfilled = UNFILLED in table.toDF().schema.fieldNames()
            if not unfilled and self._unheld_partial(src, table, [mq(k) for k in key]):
                # the first partial row without a base: the mirror gets the column
                self.spark.sql(
                    f"ALTER TABLE delta.{quote(str(path))} ADD COLUMNS ({UNFILLED} array<string>)"
                )
                table, unfilled = DeltaTable.forPath(self.spark, str(path)), True
            # Null-safe: under REPLICA IDENTITY FULL without a primary key, the key is
            # every column, and a NULL value must still match its row.
            on = " AND ".join(f"t.{mq(k)} <=> s.{mq(k)}" for k in key)
            newer = f"s.{W_LSN} > t.{LSN}"
            assign: dict[str, str | Column] = {
                mq(c): f"CASE WHEN s.{W_KEEP}{i} THEN t.{mq(c)} ELSE s.{mq(c)} END"
                for i, c in enumerate(values)
            }
            assign[LSN] = f"s.{W_LSN}"
            insert: dict[str, str | Column] = {mq(c): f"s.{mq(c)}" for c in columns}
            insert[LSN] = f"s.{W_LSN}"
            merge = table.alias("t").merge(src.alias("s"), on)
            merge = merge.whenMatchedDelete(condition=f"s.{W_OP} = 'delete' AND {newer}")
            if unfilled:
                # still unfilled: what the held row lacked and this one does not supply
                still = (
                    f"nullif(filter(coalesce(t.{UNFILLED}, array()),"
                    f" x -> NOT array_contains(s.{W_SUPPLIED}, x)), array())"
                )
                assign[UNFILLED] = still
                insert[UNFILLED] = f"nullif(s.{W_UNFILLED}, array())"
                # An older row fills the held row's unfilled columns; its version stays.
                # (a column's name is a literal value here, never SQL text)
                fill: dict[str, str | Column] = {
                    mq(c): F.when(
                        F.array_contains(F.col(f"t.{UNFILLED}"), F.lit(c))
                        & ~F.col(f"s.{W_KEEP}{i}"),
                        F.col(f"s.{mq(c)}"),
                    ).otherwise(F.col(f"t.{mq(c)}"))
                    for i, c in enumerate(values)
                }
                fill[UNFILLED] = still
                merge = merge.whenMatchedUpdate(
                    condition=f"s.{W_OP} <> 'delete' AND NOT ({newer})"
                    f" AND size(coalesce(t.{UNFILLED}, array())) > 0",
                    set=fill,
                )
            (
                merge.whenMatchedUpdate(condition=f"s.{W_OP} <> 'delete' AND {newer}", set=assign)
                .whenNotMatchedInsert(condition=f"s.{W_OP} <> 'delete'", values=insert)
                .execute()
            )
            return int(src.count())
        finally:
            src.unpersist()

    @staticmethod
    def _unheld_partial(src: DataFrame, table: Any, key: list[str]) -> bool:
        """Whether a row of ``src`` lacks unfilled columns (``W_UNFILLED``) and has no row
        in ``table`` to take them from: only then does a mirror need the unfilled column
        (the rows of a table with TOAST values usually find their base)."""
        partial = src.where(F.size(W_UNFILLED) > 0)
        if not partial.limit(1).count():
            return False
        held = table.toDF().select(*[F.col(k).alias(f"{W_KEY}{i}") for i, k in enumerate(key)])
        on = [F.col(k).eqNullSafe(F.col(f"{W_KEY}{i}")) for i, k in enumerate(key)]
        cond = on[0]
        for c in on[1:]:
            cond = cond & c
        return bool(partial.join(held, cond, "left_anti").limit(1).count())

    # -- truncate, DDL and snapshot markers ----------------------------------------------

    def _control(self, path: Path, name: str, c: _Control) -> str | None:
        if c.op == "truncate":
            return self._truncate(path, name, c.lsn)
        if c.op == "snapshot":
            return self._snapshot(path, name, c)
        ddl = c.ddl or {}
        if ddl.get("dropped"):
            log.info("%s dropped in Postgres: its mirror at %s is kept", name, path)
            return f"{name}: table dropped (mirror kept)"
        columns = ddl.get("columns")
        if not columns:
            return None
        after = {str(col["name"]): str(col["type"]) for col in columns}
        if not self._exists(path):
            self._create(path, name, after, list(ddl.get("primary_key") or []))
            self._set_property(path, SCHEMA_AT, f"{c.lsn}:{c.seq}")
            numbers = column_numbers(columns)
            if numbers:
                self._set_property(path, NUMBERS, json.dumps(numbers))
            return f"{name}: created"
        if (c.lsn, c.seq) <= self._schema_position(path):
            # Applied before (a replayed batch, or this DDL's copy from another
            # partition): the mirror may already be past it.
            return None
        changes = []
        recreated = str(ddl.get("tag", "")).upper() == "CREATE TABLE"
        if recreated and self._truncate(path, name, c.lsn):
            # Dropped and created again: the rows of the old table are gone.
            changes.append("re-created (rows of the dropped table removed)")
        current = self._columns(path)
        removed = [col for col in current if col not in after]
        added = {col: t for col, t in after.items() if col not in current}
        numbers = column_numbers(columns)
        known: dict[str, int] = json.loads(self._properties(path).get(NUMBERS, "{}"))
        # Columns of the event the mirror holds already, though no DDL it applied named
        # them: rows older than this DDL carrying its new names brought them (see _fold).
        early = [col for col in after if col in current and col not in known]
        # by column number, never guessed from the statement (shared.contract.ddl)
        statement = str(ddl.get("statement") or "")
        renames = ddl_renames(removed, [*added, *early], known, numbers, statement)
        folds = [(o, n) for o, n in renames if n not in added]
        renames = [(o, n) for o, n in renames if n in added]
        if folds:
            self._fold(path, current, folds)
        for old, new in folds:
            changes.append(f"column {old} renamed to {new} (merged into its early copy)")
            removed.remove(old)
        # Names for the renamed columns as for added ones: free of the kept columns' twins.
        kept = [f.name for c, f in current.items() if c not in removed]
        targets = mirror_names(kept, [n for _, n in renames])
        if renames:
            pairs = {current[o].name: targets[n] for o, n in renames}
            self._rewrite(path, lambda df: df.withColumnsRenamed(pairs))
        for old, new in renames:
            changes.append(f"column {old} renamed to {new}")
            removed.remove(old)
            added.pop(new)
        if removed:
            self._rewrite(path, lambda df: df.drop(*[current[c].name for c in removed]))
            changes.append(f"dropped {', '.join(removed)}")
        moved: dict[str, str | None] = {**dict(folds), **dict(renames)}
        self._unfilled_after(path, {**moved, **dict.fromkeys(removed)})
        widened = {
            col: spark_type(t)
            for col, t in after.items()
            if col in current and _widens(current[col].dataType, spark_type(t))
        }
        if widened:
            # int -> bigint, real -> double, anything -> text: rewritten with the wider
            # type, so later values fit instead of being quarantined one by one.
            self._rewrite(
                path,
                lambda df: df.withColumns(
                    {
                        current[c].name: F.col(quote(current[c].name)).cast(t)
                        for c, t in widened.items()
                    }
                ),
            )
            changes.append(
                "widened " + ", ".join(f"{c} to {t.simpleString()}" for c, t in widened.items())
            )
        if added:
            self._add_columns(path, kept + list(targets.values()), added)
            changes.append(f"added {', '.join(added)}")
        if numbers:
            self._set_property(path, NUMBERS, json.dumps(numbers))
        self._set_property(path, SCHEMA_AT, f"{c.lsn}:{c.seq}")
        return f"{name}: {'; '.join(changes)}" if changes else None

    def _truncate(self, path: Path, name: str, lsn: int) -> str | None:
        if not self._exists(path):
            return None
        if lsn <= int(self._properties(path).get(TRUNCATED, "0")):
            return None  # applied before this batch was replayed
        # Only rows older than the truncate: under primary-key partitioning it reaches
        # every partition, and rows written after it may have been merged from another
        # partition first.
        self.spark.sql(f"DELETE FROM delta.{quote(str(path))} WHERE {LSN} < {int(lsn)}")
        self._set_property(path, TRUNCATED, str(lsn))
        return f"{name}: truncated"

    def _snapshot(self, path: Path, name: str, c: _Control) -> str | None:
        """A snapshot marker (docs/events.md, "Snapshots"). The start changes nothing. The
        end (version S = its LSN) says every row the table now has was delivered with a
        version >= S, so a mirror row older than S no longer exists in the source: it is
        removed, as by a truncate at S, except that the floor recorded is S - 1 so that
        the snapshot's own rows (version S, from other partitions) still land after it.
        A redelivered end marker, or its copy from another partition, does nothing."""
        info = c.snapshot or {}
        sid = info.get("id")
        if info.get("phase") != "end":
            log.info("%s: snapshot %s started (version %d)", name, sid, c.lsn)
            return f"{name}: snapshot {sid} started"
        if not self._exists(path):
            return None  # no row of the table was ever mirrored: nothing older than S
        floor = c.lsn - 1
        if floor <= int(self._properties(path).get(TRUNCATED, "0")):
            return None  # applied before, or a truncate after the snapshot's start
        done = self.spark.sql(f"DELETE FROM delta.{quote(str(path))} WHERE {LSN} < {int(c.lsn)}")
        removed = _affected(done)
        self._set_property(path, TRUNCATED, str(floor))
        log.info(
            "%s: snapshot %s ended (version %d, %s rows delivered): %s rows older than it"
            " removed",
            name, sid, c.lsn, info.get("rows"), "?" if removed is None else removed,
        )  # fmt: skip
        gone = "" if removed is None else f"{removed} "
        return f"{name}: snapshot {sid} ended, {gone}rows older than it removed"

    def _fold(
        self, path: Path, current: dict[str, T.StructField], folds: list[tuple[str, str]]
    ) -> None:
        """Complete renames ``(old, new)`` whose ``new`` column the mirror holds already:
        each row keeps ``new`` where it has a value, else takes ``old``'s; ``old`` goes.

        How ``new`` got there before its DDL: a snapshot's ``read`` row is read from the
        table as it is when its chunk is read — after a rename that committed meanwhile —
        yet carries a version below that rename (the slot's restart position minus one),
        so in LSN order it sorts before the DDL, and ``_merge`` added the column it
        carries. Taken as a drop of ``old`` and an add of ``new``, the rename would leave
        ``new`` NULL in every row whose read row was refused as older than the row
        (issue 37, defect 3). Why the merge is exact, once the batch is applied: a value
        under ``new`` comes from a change whose content is after the rename, one under
        ``old`` from a change before it; per key the stream delivers every change before
        the rename no later than a read row taken after it, so where ``new`` is NULL,
        either no such read row landed (``old`` holds the row's value at the rename) or
        it carried NULL, and then the newest change before the rename, merged too, left
        ``old`` NULL as well; changes after the rename land after this DDL. Run again
        after a crash (the batch replayed: its segment before the DDL may bring ``old``
        back as a column): folded again, to the same result."""

        def change(df: DataFrame) -> DataFrame:
            for old, new in folds:
                target = current[new]
                merged = F.coalesce(
                    F.col(quote(target.name)), F.col(quote(current[old].name)).cast(target.dataType)
                )
                df = df.withColumn(target.name, merged).drop(current[old].name)
            return df

        self._rewrite(path, change)

    def _unfilled_after(self, path: Path, moved: dict[str, str | None]) -> None:
        """Columns renamed (old → new) or dropped (old → None) by a DDL: the rows that
        still lack them (``_walcast_unfilled``) name them as they are now, so the older
        row that carries them — under the new name — fills them, and a dropped one is
        no longer waited for. Only the files holding such rows are rewritten."""
        if not moved:
            return
        from delta.tables import DeltaTable

        table = DeltaTable.forPath(self.spark, str(path))
        if UNFILLED not in table.toDF().schema.fieldNames():
            return
        names = _renamed_in(F.col(UNFILLED), moved)
        table.update(F.col(UNFILLED).isNotNull(), {UNFILLED: F.when(F.size(names) > 0, names)})

    def _rewrite(self, path: Path, change: Callable[[DataFrame], DataFrame]) -> None:
        """Rename / drop a column by rewriting the table (a new version; older ones stay
        readable by time travel until vacuumed). Table properties are kept."""
        df = change(self.spark.read.format("delta").load(str(path)))
        (
            df.write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .save(str(path))
        )


# Casts that lose nothing: a column whose Postgres type was changed to one of these
# targets is rewritten with it (Spark types as the type table maps them).
_WIDENINGS: dict[type[T.DataType], tuple[type[T.DataType], ...]] = {
    T.ShortType: (T.IntegerType, T.LongType, T.DoubleType, T.StringType),
    T.IntegerType: (T.LongType, T.DoubleType, T.StringType),
    T.LongType: (T.StringType,),
    T.FloatType: (T.DoubleType, T.StringType),
    T.DoubleType: (T.StringType,),
    T.DateType: (T.TimestampNTZType, T.TimestampType, T.StringType),
    T.BooleanType: (T.StringType,),
}


def _names(maybe: list[Column]) -> Column:
    """An array of the non-null values of ``maybe`` (column names, as literals)."""
    return F.filter(F.array(*maybe, F.lit(None).cast("string")), lambda x: x.isNotNull())


def _renamed_in(names: Column, moved: dict[str, str | None]) -> Column:
    """``names`` (an array of Postgres column names) after renames and drops: ``moved``
    maps an old name to its new one, or to None for a dropped column."""

    def rename(old: str, new: str) -> Callable[[Column], Column]:
        return lambda x: F.when(x == F.lit(old), F.lit(new)).otherwise(x)

    def keep(old: str) -> Callable[[Column], Column]:
        return lambda x: x != F.lit(old)

    for old, new in moved.items():
        names = F.filter(names, keep(old)) if new is None else F.transform(names, rename(old, new))
    return names


def _affected(result: DataFrame) -> int | None:
    """The row count a Delta DELETE answers with (``num_affected_rows``), if it does."""
    if "num_affected_rows" not in result.columns:
        return None
    row = result.first()
    return None if row is None or row[0] is None else int(row[0])


def _widens(current: T.DataType, target: T.DataType) -> bool:
    return type(target) in _WIDENINGS.get(type(current), ())


def _table_failure(exc: BaseException) -> bool:
    """A failure of one table's mirror (a schema Delta or Spark refuses, a column it
    cannot hold), not of the job: Spark's analysis errors, Delta's schema errors, and
    walcast's own checks of a mirror."""
    from pyspark.errors import AnalysisException, IllegalArgumentException

    if isinstance(exc, (AnalysisException, IllegalArgumentException, MirrorError)):
        return True
    text = str(exc)
    return any(marker in text for marker in _TABLE_MARKERS)


# Delta reports some schema problems as plain Java exceptions through Py4J.
_TABLE_MARKERS = (
    "DeltaAnalysisException",
    "AnalysisException",
    "DELTA_INVALID_CHARACTERS_IN_COLUMN_NAME",
    "DELTA_DUPLICATE_COLUMNS_FOUND",
    "DELTA_FAILED_TO_MERGE_FIELDS",
    "DeltaIllegalArgumentException",
)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


_ORIGIN = ("topic", "partition", "offset", "kafka_ts")
_TRANSLATED = T.StructType(
    [
        T.StructField("values", T.ArrayType(T.BinaryType())),
        T.StructField("reason", T.StringType()),
    ]
)


_decoders: dict[str, RegistryDecoder] = {}  # per Python worker, by registry URL


def _translate_record(
    fmt: str, registry: SchemaRegistrySettings | None, key: bytes | None, value: bytes | None
) -> tuple[Any, Any]:
    """(events, None) or (None, why not), on an executor: an Avro record (first byte 0)
    decoded through the registry first; then a walcast event as it is, a Debezium record
    as the events it stands for (none for a tombstone)."""
    try:
        if registry is not None and value and value[0] == 0:
            decoder = _decoders.get(str(registry.url))
            if decoder is None:
                decoder = _decoders[str(registry.url)] = RegistryDecoder(registry.client())
            value = decoder.decode(value)
            if key and key[0] == 0:  # an Avro Debezium key
                key = decoder.decode(key)
        if fmt == "walcast" or (fmt == "auto" and not is_debezium(value)):
            return [value], None
        return debezium_translate(key, value), None
    except Exception as exc:
        # The per-record boundary (as kafka2search's consumer loop): any failure on this
        # record quarantines it with the reason; a failing UDF would fail every batch.
        if limits.passes(exc):
            raise  # the registry unreachable: the batch fails and is tried again
        return None, str(limits.unreadable(exc))


def translate(raw: DataFrame, fmt: str, registry: SchemaRegistrySettings | None) -> DataFrame:
    """``raw`` with ``t``: the walcast events (``t.values``) each record stands for, or
    the reason it is unreadable (``t.reason``) — the same translation kafka2search runs
    (shared.avro, shared.formats.debezium_input), in a Python UDF: an Avro record needs
    its writer schema from the registry, a Debezium record's values the Connect schema
    that travels with it. The record's own value is kept only where it is unreadable
    (for the quarantine)."""

    def run(k: bytes | None, v: bytes | None) -> tuple[Any, Any]:
        return _translate_record(fmt, registry, k, v)

    udf = F.udf(run, _TRANSLATED, useArrow=False)
    out = raw.withColumn("t", udf(F.col("key"), F.col("value")))
    return out.withColumn("value", F.when(F.col("t.reason").isNotNull(), F.col("value")))


class MirrorError(RuntimeError):
    """A mirror that cannot take its table's changes (a walcast check)."""


def _reason() -> Column:
    """Why a record is not a change event (null when it is one): the rules of
    :func:`shared.contract.event.decode`, as Spark column expressions (they run on the
    executors; ``tests/integration/kafka2spark/test_event_contract.py`` holds both to the
    same verdicts)."""
    e = F.col("e")
    data = F.col("e.op").isin(*DATA_OPS)
    return (
        F.when(F.col("value").isNull(), F.lit("empty record (no value)"))
        .when(
            e.isNull() | F.json_object_keys(F.col("value").cast("string")).isNull(),
            F.lit("not a JSON object"),
        )
        .when(
            F.col("e.v").isNull() | (F.col("e.v") != EVENT_VERSION),
            F.lit("unknown event version"),
        )
        .when(
            F.col("e.op").isNull() | ~F.col("e.op").isin(*DATA_OPS, *CONTROL_OPS),
            F.lit("unknown op"),
        )
        .when(
            F.col("e.db").isNull() | F.col("e.schema").isNull() | F.col("e.table").isNull(),
            F.lit("field db, schema or table missing or not a string"),
        )
        .when(
            F.col("e.lsn").isNull() | (F.col("e.lsn") < 0),
            F.lit("field 'lsn' missing or not a non-negative integer"),
        )
        .when(
            F.col("e.epoch").isNotNull()
            & ((F.col("e.epoch") < 0) | (F.col("e.epoch") > MAX_EPOCH)),
            F.lit(f"field 'epoch' not an integer from 0 to {MAX_EPOCH}"),
        )
        .when(
            (F.coalesce(F.col("e.epoch"), F.lit(0)) > 0) & (F.col("e.lsn") > MAX_EPOCH_LSN),
            F.lit(f"field 'lsn' above 2^{EPOCH_SHIFT}-1 in an epoch above 0"),
        )
        .when(
            F.col("e.oversized").isNotNull(),
            F.concat(
                F.lit("a reference to a change of "),
                F.col("e.oversized").cast("string"),
                F.lit(" bytes, larger than Kafka accepts (row not carried): re-snapshot the row"),
            ),
        )
        .when(data & F.col("e.key").isNull(), F.lit("field 'key' missing"))
        .when(
            F.col("e.op").isin("insert", "update", "read") & F.col("e.new").isNull(),
            F.concat(F.col("e.op"), F.lit(" without a 'new' row")),
        )
        .when(
            # Spark's reader leaves a snapshot that is no object null: is it there at all?
            # (Evaluated only for a read row without one.)
            (F.col("e.op") == "read")
            & F.col("e.snapshot").isNull()
            & F.get_json_object(F.col("value").cast("string"), "$.snapshot").isNotNull(),
            F.lit("field 'snapshot' is not an object"),
        )
        .when((F.col("e.op") == "ddl") & F.col("e.ddl").isNull(), F.lit("ddl event without 'ddl'"))
        .when(
            (F.col("e.op") == "snapshot") & F.col("e.snapshot").isNull(),
            F.lit("snapshot event without a 'snapshot' object"),
        )
        .when(
            (F.col("e.op") == "snapshot")
            & (F.col("e.snapshot.phase").isNull() | ~F.col("e.snapshot.phase").isin(*PHASES)),
            F.lit("snapshot 'phase' missing or not 'start' or 'end'"),
        )
        .when(
            (F.col("e.op") == "snapshot")
            & (F.col("e.snapshot.id").isNull() | (F.col("e.snapshot.id") < 0)),
            F.lit("snapshot 'id' missing or not an integer from 0 to 2^63-1"),
        )
    )


def _distinct(controls: list[_Control]) -> Iterator[_Control]:
    """``controls`` (sorted by table, LSN, seq) without the copies other partitions
    carried: under primary-key partitioning every partition has one of each table-wide
    event, all alike, and applying one is applying them all (events that share a position
    but differ, such as a snapshot's start and end markers, are all kept)."""
    seen: set[str] = set()
    for c in controls:
        ident = json.dumps(
            [c.table, c.lsn, c.seq, c.op, c.snapshot, c.ddl], sort_keys=True, default=str
        )
        if ident not in seen:
            seen.add(ident)
            yield c


def _cuts(c: _Control) -> bool:
    """Whether a control event changes the mirror, so the rows before it are merged
    before it is applied: a truncate, a snapshot's end, a schema change (not a table's
    drop, which keeps the mirror, nor a snapshot's start, which is only recorded)."""
    if c.op == "snapshot":
        return (c.snapshot or {}).get("phase") == "end"
    if c.op == "ddl":
        return not (c.ddl or {}).get("dropped")
    return True


def _segment_expr(by_table: dict[str, list[_Control]]) -> Column:
    """Which segment of its table a data event falls in: the number of the table's
    control events before it (by LSN, then position in the transaction)."""
    seg: Column = F.lit(0)
    for table, ctl in by_table.items():
        count: Column = F.lit(0)
        for c in ctl:
            before = (F.col("lsn") > c.lsn) | ((F.col("lsn") == c.lsn) & (F.col("seq") > c.seq))
            count = count + F.when(before, 1).otherwise(0)
        seg = F.when(F.col(TKEY) == table, count).otherwise(seg)
    return seg
