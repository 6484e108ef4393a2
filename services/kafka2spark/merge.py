"""One segment of a table's rows MERGEd into its mirror: the newest change per key, each
column from the newest change that supplied it (else the stored value), guarded by the
row's version; values Spark cannot hold quarantined with the reason; the rows of an
insert-only table appended once each instead (:mod:`services.kafka2spark.append_only`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from services.kafka2spark import append_only
from services.kafka2spark.append_only import W_ROW
from services.kafka2spark.names import (
    CORRUPT,
    HASH,
    LSN,
    TRUNCATED,
    W_BEYOND,
    W_CARRY,
    W_FALLBACK,
    W_HASH,
    W_KAFKA,
    W_KEEP,
    W_KEY,
    W_LSN,
    W_NEW,
    W_OP,
    W_PRESENT,
    W_RANK,
    W_SEQ,
    W_SUPPLIED,
    W_TOAST,
    W_UNFILLED,
    W_XID,
    XID,
    MirrorError,
    quote,
)
from services.kafka2spark.tables import DeltaTables
from shared.contract.event import UNFILLED

log = logging.getLogger(__name__)

Quarantine = Callable[[DataFrame, int, str], int]
"""Appends a batch's refused rows (key, value, reason, topic, partition, offset,
kafka_ts) to the quarantine table, idempotently per (name, batch id); returns how many."""

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


class Merger:
    """MERGEs segments into the mirrors of ``tables``. ``beyond``: table -> date / time
    values outside years 1..9999 stored as NULL, of the batch in hand (the mirror sets it
    per batch)."""

    def __init__(self, spark: SparkSession, tables: DeltaTables, quarantine: Quarantine) -> None:
        self.spark = spark
        self.tables = tables
        self.quarantine = quarantine
        self.beyond: dict[str, int] = {}

    def merge(
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
        fresh = False  # created for these rows: nothing in it to match
        if not self.tables.exists(path):
            # sorted: which case twin keeps the plain name must not depend on the batch
            self.tables.create(path, name, {c: types[c][0] for c in sorted(types)}, key, appending)
            fresh = True
        elif appending:
            append_only.ensure_column(self.spark, path)
        current = self.tables.columns(path)
        schema_lsn, _ = self.tables.schema_position(path)
        # A column the mirror lacks is added — unless only changes older than the last
        # DDL carry it (a column that DDL renamed or dropped, seen again on a replay).
        new = {
            c: types[c][0] for c in sorted(types) if c not in current and types[c][1] > schema_lsn
        }
        if new:
            self.tables.add_columns(path, [f.name for f in current.values()], new)
            current = self.tables.columns(path)
        missing = [k for k in key if k not in current]
        if missing:
            raise MirrorError(f"{name}: key columns {missing} are not in the mirror at {path}")
        truncated = int(self.tables.properties(path).get(TRUNCATED, "0"))
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
            F.col("hash").alias(W_HASH),
            F.coalesce(F.col("xid"), F.lit(0)).alias(W_XID),
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
            W_HASH,
            W_XID,
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
            # One pass for both counts: values beyond years 1..9999, values that fit no type.
            n, corrupt_n = src.agg(F.sum(W_BEYOND), F.count(CORRUPT)).first() or (0, 0)
            if n:
                self.beyond[name] = self.beyond.get(name, 0) + int(n)
                log.warning(
                    "%s: %d date/time values outside years 1..9999 stored as NULL (the"
                    " changelog keeps the exact text)",
                    name,
                    n,
                )
            if corrupt_n:
                # A value Spark cannot convert to the column's type is not merged as null:
                # the change goes to the quarantine with the reason, the rest goes on.
                corrupt = src.where(F.col(CORRUPT).isNotNull()).select(
                    F.col(f"{W_KAFKA}kafka_key").alias("key"),
                    F.col(f"{W_KAFKA}kafka_value").alias("value"),
                    F.concat(
                        F.lit(f"a value does not fit the column types of {name}: "),
                        F.col(CORRUPT),
                    ).alias("reason"),
                    *[F.col(f"{W_KAFKA}{c}").alias(c) for c in ("topic", "partition", "offset")],
                    F.col(f"{W_KAFKA}kafka_ts").alias("kafka_ts"),
                )
                app = f"values-{path.name}-{segment}{'-appended' if appending else ''}"
                self.quarantine(corrupt, batch_id, app)
            good = src.where(F.col(CORRUPT).isNull())
            if appending:
                return append_only.append_rows(self.spark, path, good, names)
            return self.merge_good(path, good, names, key, fresh)
        finally:
            src.unpersist()

    def merge_good(
        self, path: Path, src: DataFrame, names: dict[str, str], key: list[str], fresh: bool
    ) -> int:
        """Newest change per key; each column from the newest change that supplied it
        (an update leaves out unchanged TOAST values, and a change older than a DDL lacks
        the columns it added), else the stored value. ``names``: Postgres name → mirror
        name of every column. ``fresh``: the mirror was created for these rows — the
        MERGE would only insert, so they are appended (a fraction of a MERGE's work: no
        join, no source materialised twice); a batch run again finds the mirror there
        and MERGEs, which changes nothing."""
        from delta.tables import DeltaTable

        columns = list(names)

        def mq(c: str) -> str:
            return quote(names[c])

        by_key = [F.col(mq(k)) for k in key]
        # A column is carried into the newest change only from the changes of its key that
        # arrived before it — the key's previous states, in the stream's order. An older
        # row arriving after it (redelivered after a producer restart: from before an
        # update an earlier batch applied, or a snapshot's read row) may be staler than
        # the stored value: it is the column's *fallback*, used only where the mirror
        # holds no value (no row, or the column unfilled: fill_unfilled).
        arrival = [F.col(f"{W_KAFKA}{c}") for c in ("topic", "partition", "offset")]
        keyed = Window.partitionBy(*by_key)
        before = keyed.orderBy(*arrival).rowsBetween(Window.unboundedPreceding, 0)
        # the rows after, as a frame that grows (Spark computes it incrementally; a frame
        # up to the end would be computed again for every row)
        after = keyed.orderBy(*[a.desc() for a in arrival]).rowsBetween(
            Window.unboundedPreceding, -1
        )
        values = [c for c in columns if c not in key]
        for i, c in enumerate(values):
            supplied = (
                (F.col(W_OP) != "delete")
                & F.array_contains(W_PRESENT, c)
                & ~F.array_contains(W_TOAST, c)  # Postgres names, as the event has them
            )
            value = F.when(supplied, F.struct(F.col(mq(c)).alias("v")))
            src = src.withColumn(f"{W_CARRY}{i}", F.last(value, True).over(before))
            newest_older = F.when(supplied, F.struct(F.col(W_LSN), F.col(W_SEQ)))
            src = src.withColumn(f"{W_FALLBACK}{i}", F.max_by(value, newest_older).over(after))
        keep = [F.col(f"{W_CARRY}{i}").isNull() for i in range(len(values))]
        backed = [F.col(f"{W_FALLBACK}{i}").isNotNull() for i in range(len(values))]
        # Unfilled (shared.contract.event.fill_unfilled): TOAST columns the newest change
        # left out and no change of the batch supplied — the stored row's value, or none.
        lacking = [
            F.when(k & ~b & F.array_contains(W_TOAST, c), F.lit(c))
            for k, b, c in zip(keep, backed, values, strict=True)
        ]
        # The newest change's row hash: null (unknown) when it left a TOAST value out, even
        # if an older change of the batch supplied it (docs/design.md#verification).
        src = src.select(
            W_LSN,
            W_SEQ,
            W_OP,
            W_HASH,
            W_XID,
            *arrival,
            *[F.col(mq(k)) for k in key],
            *[
                F.coalesce(F.col(f"{W_CARRY}{i}"), F.col(f"{W_FALLBACK}{i}")).v.alias(names[c])
                for i, c in enumerate(values)
            ],
            *[k.alias(f"{W_KEEP}{i}") for i, k in enumerate(keep)],
            *[b.alias(f"{W_FALLBACK}{i}") for i, b in enumerate(backed)],
            _names(lacking).alias(W_UNFILLED),
            # the columns this row supplies: what it fills in a held row (fill_unfilled)
            _names(
                [F.when(~k | b, F.lit(c)) for k, b, c in zip(keep, backed, values, strict=True)]
            ).alias(W_SUPPLIED),
        )
        # of two copies of the newest change (a redelivery), the first to arrive
        newest = Window.partitionBy(*by_key).orderBy(
            F.col(W_LSN).desc(), F.col(W_SEQ).desc(), *arrival
        )
        src = (
            src.withColumn(W_RANK, F.row_number().over(newest)).where(F.col(W_RANK) == 1)
        ).persist()
        try:
            table = DeltaTable.forPath(self.spark, str(path))
            held_columns = table.toDF().schema.fieldNames()
            if HASH not in held_columns:  # a mirror made before verify's columns
                self.spark.sql(
                    f"ALTER TABLE delta.{quote(str(path))}"
                    f" ADD COLUMNS ({HASH} bigint, {XID} bigint)"
                )
                table = DeltaTable.forPath(self.spark, str(path))
            unfilled = UNFILLED in held_columns
            if not unfilled and self.unheld_partial(src, table, [mq(k) for k in key]):
                # the first partial row without a base: the mirror gets the column
                self.spark.sql(
                    f"ALTER TABLE delta.{quote(str(path))} ADD COLUMNS ({UNFILLED} array<string>)"
                )
                table, unfilled = DeltaTable.forPath(self.spark, str(path)), True
            if fresh:
                src.where(F.col(W_OP) != "delete").select(
                    *[F.col(mq(c)) for c in columns],
                    F.col(W_LSN).alias(LSN),
                    F.col(W_HASH).alias(HASH),
                    F.col(W_XID).alias(XID),
                    *(
                        [F.expr(f"nullif({W_UNFILLED}, array())").alias(UNFILLED)]
                        if unfilled
                        else []
                    ),
                ).write.format("delta").mode("append").save(str(path))
                return int(src.count())
            # Null-safe: under REPLICA IDENTITY FULL without a primary key, the key is
            # every column, and a NULL value must still match its row.
            on = " AND ".join(f"t.{mq(k)} <=> s.{mq(k)}" for k in key)
            newer = f"s.{W_LSN} > t.{LSN}"
            # a column the newest change and those before it left out: the stored value,
            # or — where the mirror has none (unfilled) — the fallback's
            assign: dict[str, str | Column] = {}
            for i, c in enumerate(values):
                lacks = (
                    F.array_contains(
                        F.coalesce(F.col(f"t.{UNFILLED}"), F.array().cast("array<string>")),
                        F.lit(c),
                    )
                    if unfilled
                    else F.lit(False)
                )
                assign[mq(c)] = (
                    F.when(~F.col(f"s.{W_KEEP}{i}"), F.col(f"s.{mq(c)}"))
                    .when(F.col(f"s.{W_FALLBACK}{i}") & lacks, F.col(f"s.{mq(c)}"))
                    .otherwise(F.col(f"t.{mq(c)}"))
                )
            insert: dict[str, str | Column] = {mq(c): f"s.{mq(c)}" for c in columns}
            for held, working in ((LSN, W_LSN), (HASH, W_HASH), (XID, W_XID)):
                # (a fill below writes none of them: the held version stays, its hash too)
                assign[held] = insert[held] = f"s.{working}"
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
                        & (~F.col(f"s.{W_KEEP}{i}") | F.col(f"s.{W_FALLBACK}{i}")),
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
    def unheld_partial(src: DataFrame, table: Any, key: list[str]) -> bool:
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


def _names(maybe: list[Column]) -> Column:
    """An array of the non-null values of ``maybe`` (column names, as literals)."""
    return F.filter(F.array(*maybe, F.lit(None).cast("string")), lambda x: x.isNotNull())
