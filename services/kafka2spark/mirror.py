"""One micro-batch of change events into Delta: quarantine, changelog, per-table mirrors.

This module holds the batch's order, which is the correctness argument; its parts live
beside it: :mod:`.envelope` (what a record is: translation and the quarantine's
verdict), :mod:`.plan` (control events and segments), :mod:`.merge` (one segment into a
mirror), :mod:`.tables` (a mirror's Delta table, its properties and the table-wide
events applied to it), :mod:`.names` (column, property and directory names).

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

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from services.kafka2spark.envelope import ORIGIN, reason, translate
from services.kafka2spark.held import read_held, read_mirrors, write_held
from services.kafka2spark.merge import Merger
from services.kafka2spark.names import SOURCE_LSN, TKEY, MirrorError, table_dir
from services.kafka2spark.plan import Control, cuts, plan
from services.kafka2spark.schema import ENVELOPE
from services.kafka2spark.settings import Kafka2SparkSettings
from services.kafka2spark.tables import DeltaTables
from shared.contract.event import EPOCH_SHIFT
from shared.failpoints import failpoint

log = logging.getLogger(__name__)


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
        self._last_records = 0  # the last batch's (spark.interpret_below)
        # The id of the last micro-batch handed to the mirror: a stop waits until Spark
        # reports it done, checkpoint included (trigger.stop_grace_s).
        self.batch_id: int | None = None
        self.tables = DeltaTables(spark, self.root, read_mirrors(self.root))
        self.merger = Merger(spark, self.tables, self._quarantine)

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

    def _plans_for(self, records: int, batch_session: SparkSession) -> None:
        """Compiled or interpreted plans for a batch of ``records`` (``spark.interpret_below``):
        set in the stream's session, which the batch's DataFrames use, and in the job's,
        which the MERGEs run in. Keys the user set in ``spark.conf`` are left alone."""
        below = self.s.spark.interpret_below
        if not below:
            return
        interpret = records < below
        for key, compiled, interpreted in _CODEGEN:
            if key in self.s.spark.conf:
                continue
            for session in {id(self.spark): self.spark, id(batch_session): batch_session}.values():
                session.conf.set(key, interpreted if interpret else compiled)

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
        self.batch_id = batch_id
        failpoint("kafka2spark.batch_started")
        started = time.monotonic()
        result = BatchResult(batch_id)
        self.merger.beyond = result.beyond
        raw = df.select(
            "key", "value", "topic", "partition", "offset", F.col("timestamp").alias("kafka_ts")
        )
        registry = self.s.schema_registry if self.s.schema_registry.url else None
        if self.s.source.input_format != "walcast" or registry is not None:
            # Translated before it is cached: the cache holds walcast's events, not the
            # Debezium records (several times larger with their schemas).
            raw = translate(raw, self.s.source.input_format, registry)
        # Read as the last batch's size asks (batches of a stream are alike; the first
        # after a start interpreted), the rest as this one's (spark.interpret_below).
        self._plans_for(self._last_records, df.sparkSession)
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
                self._last_records = result.records
                self._plans_for(result.records, df.sparkSession)
                self._batch(raw, batch_id, result)
        finally:
            raw.unpersist()
        result.seconds = time.monotonic() - started
        self.on_batch(result)

    def _batch(self, raw: DataFrame, batch_id: int, result: BatchResult) -> None:
        untranslatable: DataFrame | None = None
        if "t" in raw.columns:  # translated input (see translate)
            untranslatable = raw.where(F.col("t.reason").isNotNull()).select(
                "key", "value", F.col("t.reason").alias("reason"), *ORIGIN
            )
            raw = raw.where(F.col("t.reason").isNull()).select(
                "key", F.explode("t.values").alias("value"), *ORIGIN
            )
        # Persisted once parsed: the quarantine's count and every later step read the
        # parsed records, not the JSON again (the quarantine check alone took ~13% of a
        # batch when each step parsed anew).
        parsed = (
            raw.withColumn("e", F.from_json(F.col("value").cast("string"), ENVELOPE))
            .withColumn("reason", reason())
            .persist()
        )
        bad = parsed.where(F.col("reason").isNotNull())
        if untranslatable is not None:
            bad = bad.select("key", "value", "reason", *ORIGIN).unionByName(untranslatable)
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
            controls, data, tables, key_cols, keyless = plan(events)
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

    def _table(
        self,
        path: Path,
        label: str,
        name: str,
        t: dict[str, Any] | None,
        ctl: list[Control],
        data: DataFrame,
        key_cols: dict[tuple[str, int], list[str]],
        keyless: dict[tuple[str, int], int],
        batch_id: int,
        result: BatchResult,
    ) -> None:
        """One table's part of the batch: its segments merged, its truncates and DDL
        applied between them, in LSN order."""
        self.tables.creating = name  # the key create() registers a new mirror under
        if name in self.tables.mirrors and not self.tables.exists(path):
            raise MirrorError(
                f"the mirror of {label} at {path} was deleted outside walcast: its rows are"
                " gone (creating it again would leave a partial copy)"
            )
        seg = 0
        for c in ctl:
            if cuts(c):  # the rows before it first
                self._segment(path, label, name, t, seg, data, key_cols, keyless, batch_id, result)
                seg += 1
            change = self.tables.control(path, label, c)
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
            merged = self.merger.merge(path, label, rows, t["segments"][seg], key, batch_id, seg)
        if appended:  # rows of an insert-only table: appended once each
            merged += self.merger.merge(
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


# (key, compiled, interpreted): Spark's defaults, and the settings that interpret a plan
_CODEGEN = (
    ("spark.sql.codegen.wholeStage", "true", "false"),
    ("spark.sql.codegen.factoryMode", "FALLBACK", "NO_CODEGEN"),
)


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
