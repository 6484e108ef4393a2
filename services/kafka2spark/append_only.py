"""Rows of insert-only tables (``append_only`` events, docs/events.md "Insert-only tables")
into their Delta mirror: each written exactly once, idempotent by its row id.

A table streamed without any replica identity sends only inserts (and truncates): its
rows have no key to MERGE on. Each carries instead its position, from which the contract
makes an id (:func:`shared.contract.event.append_only_id`): the same on every
redelivery, different for every row — two equal rows of one ``COPY`` too. The mirror
keeps it in ``_walcast_row_id`` beside ``_walcast_lsn``.

:class:`~services.kafka2spark.mirror.DeltaMirror` parses and checks a segment's
append-only rows like any others (column types, quarantine of values that do not fit,
the truncate floor) and hands them to :func:`append_rows`, which

1. keeps one row per row id (a record redelivered within the batch is there twice);
2. MERGEs them into the mirror ``ON`` row id and version, with only ``WHEN NOT MATCHED
   INSERT``: a row already there — a redelivered batch, a replay from a fresh checkpoint,
   a crash between the Delta commit and the checkpoint's — is not inserted again. The
   condition also bounds the target's ``_walcast_lsn`` to the batch's range: Delta skips
   every file whose statistics lie outside it, and an append-only mirror's files are
   written in LSN order, so the merge reads the few files of the batch's own range, not
   the table. (An anti-join by hand and an append would do the same in two steps, without
   the atomicity; Delta's idempotent append by batch id would miss a replay under a new
   checkpoint, whose batch ids start again.)

Truncates and snapshot end markers need nothing here: they delete the rows older than
their version, whatever the row's identity. A table that gains a key later is MERGEd by
key from then on in the same mirror (``_walcast_row_id`` NULL); the automatic snapshot's
end marker removes the append-only rows, all older than it.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from shared.contract.event import EPOCH_SHIFT, ROW_HASH, ROW_XID

ROW_ID = "_walcast_row_id"
"""The mirror's column holding an append-only row's id (NULL in rows merged by key)."""
W_ROW = "__w_row_id"  # the working column of the id, before it is written
LSN = "_walcast_lsn"  # as in names.py (which imports this module)
NO_ROW_ID = (
    "an append_only row without integer commit_lsn and seq (or a snapshot without id and"
    " chunk): it has no row id"
)


def row_id() -> Column:
    """:func:`~shared.contract.event.append_only_id` as a Spark expression over an event's
    envelope columns (``commit_lsn``, ``seq``, ``epoch``, ``snapshot``): NULL when a field
    it needs is missing (the row is then quarantined with :data:`NO_ROW_ID`)."""
    version = F.col("commit_lsn") + F.coalesce(F.col("epoch"), F.lit(0)).cast("long") * F.lit(
        2**EPOCH_SHIFT
    )
    head = F.concat(version.cast("string"), F.lit("."), F.col("seq").cast("string"))
    snapshot = F.when(F.col("snapshot").isNull(), F.lit("")).otherwise(
        F.concat(
            F.lit(".s"),
            F.col("snapshot.id").cast("string"),
            F.lit("."),
            F.col("snapshot.chunk").cast("string"),
        )
    )
    return F.concat(head, snapshot)


def chosen() -> Column:
    """Which data events are append-only rows (``append_only`` true)."""
    return F.coalesce(F.col("append_only"), F.lit(False))


def ensure_column(spark: SparkSession, path: Path) -> None:
    """Add ``_walcast_row_id`` to a mirror created for keyed rows (a table whose key was
    dropped, then streamed insert-only), and verify's columns to one made before them.
    Idempotent."""
    names = spark.read.format("delta").load(str(path)).schema.fieldNames()
    if ROW_ID not in names:
        spark.sql(f"ALTER TABLE delta.{_quote(str(path))} ADD COLUMNS ({ROW_ID} string)")
    if ROW_HASH not in names:
        spark.sql(
            f"ALTER TABLE delta.{_quote(str(path))}"
            f" ADD COLUMNS ({ROW_HASH} bigint, {ROW_XID} bigint)"
        )


def append_rows(spark: SparkSession, path: Path, src: DataFrame, names: dict[str, str]) -> int:
    """Insert the rows of ``src`` whose row id (``__w_row_id``) the mirror does not hold
    (see the module doc); ``names``: Postgres name → mirror name of every column, each a
    column of ``src``; ``__w_lsn`` the row's version. Returns the rows handed in (after
    the batch's own duplicates went). Safe to run again with the same rows: it then
    inserts nothing."""
    from delta.tables import DeltaTable

    src = src.dropDuplicates([W_ROW]).persist()
    try:
        bounds = src.agg(F.min("__w_lsn").alias("lo"), F.max("__w_lsn").alias("hi")).first()
        if bounds is None or bounds["lo"] is None:
            return 0
        lo, hi = int(bounds["lo"]), int(bounds["hi"])
        on = (
            f"t.{LSN} >= {lo} AND t.{LSN} <= {hi}"  # target-only: file skipping
            f" AND t.{LSN} = s.__w_lsn AND t.{ROW_ID} = s.{W_ROW}"
        )
        values: dict[str, str | Column] = {_quote(m): f"s.{_quote(m)}" for m in names.values()}
        values[LSN] = "s.__w_lsn"
        values[ROW_ID] = f"s.{W_ROW}"
        values[ROW_HASH] = "s.__w_hash"
        values[ROW_XID] = "s.__w_xid"
        (
            DeltaTable.forPath(spark, str(path))
            .alias("t")
            .merge(src.alias("s"), on)
            .whenNotMatchedInsert(values=values)
            .execute()
        )
        return int(src.count())
    finally:
        src.unpersist()


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
