"""A mirror's Delta table as walcast keeps it: its columns and bookkeeping properties
(the last truncate, the last DDL's position, the column numbers), its creation, and the
table-wide events applied to it — truncates, snapshot end markers, schema changes (renames
and drops rewrite the table: see the package's mirror module on column mapping)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from services.kafka2spark.append_only import ROW_ID
from services.kafka2spark.held import add_mirror
from services.kafka2spark.names import (
    HASH,
    LSN,
    NUMBERS,
    OWN,
    SCHEMA_AT,
    TRUNCATED,
    XID,
    mirror_names,
    postgres_name,
    quote,
)
from services.kafka2spark.plan import Control
from services.kafka2spark.schema import spark_type
from shared.contract import keyranges
from shared.contract.ddl import column_numbers
from shared.contract.ddl import renames as ddl_renames
from shared.contract.event import UNFILLED

log = logging.getLogger(__name__)


class DeltaTables:
    """The mirrors under ``root``, each a Delta table at a path. ``mirrors``: the tables
    walcast created (db.schema.table), so a deleted one is recognised; ``creating``: the
    table a batch is working on (what :meth:`create` registers)."""

    def __init__(self, spark: SparkSession, root: Path, mirrors: set[str]) -> None:
        self.spark = spark
        self.root = root
        self.mirrors = mirrors
        self.creating = ""

    def exists(self, path: Path) -> bool:
        return (path / "_delta_log").is_dir() and any((path / "_delta_log").glob("*.json"))

    def columns(self, path: Path) -> dict[str, T.StructField]:
        """The mirror's columns (field name = mirror name, :func:`mirror_names`) by their
        Postgres names, without walcast's own ``_walcast_lsn``."""
        df = self.spark.read.format("delta").load(str(path))
        return {postgres_name(f.name): f for f in df.schema.fields if f.name not in OWN}

    def properties(self, path: Path) -> dict[str, str]:
        rows = self.spark.sql(f"SHOW TBLPROPERTIES delta.{quote(str(path))}").collect()
        return {r["key"]: r["value"] for r in rows}

    def set_property(self, path: Path, key: str, value: str) -> None:
        literal = value.replace("\\", "\\\\").replace("'", "\\'")  # column names may hold '
        self.spark.sql(
            f"ALTER TABLE delta.{quote(str(path))} SET TBLPROPERTIES ('{key}' = '{literal}')"
        )

    def schema_position(self, path: Path) -> tuple[int, int]:
        """(lsn, seq) of the last DDL applied to the mirror."""
        lsn, _, seq = self.properties(path).get(SCHEMA_AT, "0:0").partition(":")
        return int(lsn), int(seq or 0)

    def create(
        self, path: Path, name: str, types: dict[str, str], key: list[str], appending: bool = False
    ) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.createIfNotExists(self.spark).location(str(path))
        names = mirror_names([], list(types))
        for column, pg in types.items():
            builder = builder.addColumn(names[column], spark_type(pg))
        builder = builder.addColumn(LSN, T.LongType())
        builder = builder.addColumn(HASH, T.LongType()).addColumn(XID, T.LongType())
        if appending:  # an insert-only table: its rows' ids (services.kafka2spark.append_only)
            builder = builder.addColumn(ROW_ID, T.StringType())
        builder = (
            builder.property("walcast.source", name)
            .property("walcast.key", ",".join(key))
            .property(TRUNCATED, "0")
            .property(SCHEMA_AT, "0:0")
        )
        builder.execute()
        add_mirror(self.root, self.creating)
        self.mirrors.add(self.creating)
        log.info("created the mirror of %s at %s", name, path)

    def add_columns(self, path: Path, taken: list[str], new: dict[str, str]) -> None:
        names = mirror_names(taken, list(new))
        cols = ", ".join(
            f"{quote(names[c])} {spark_type(t).simpleString()}" for c, t in new.items()
        )
        self.spark.sql(f"ALTER TABLE delta.{quote(str(path))} ADD COLUMNS ({cols})")

    # -- merge ---------------------------------------------------------------------------

    def control(self, path: Path, name: str, c: Control) -> str | None:
        if c.op == "verify":  # a verification marker: the batch's checkpoint passes it
            return None
        if c.op == "truncate":
            return self.truncate(path, name, c.lsn)
        if c.op == "snapshot":
            return self.snapshot(path, name, c)
        ddl = c.ddl or {}
        if ddl.get("dropped"):
            log.info("%s dropped in Postgres: its mirror at %s is kept", name, path)
            return f"{name}: table dropped (mirror kept)"
        columns = ddl.get("columns")
        if not columns:
            return None
        after = {str(col["name"]): str(col["type"]) for col in columns}
        if not self.exists(path):
            self.create(path, name, after, list(ddl.get("primary_key") or []))
            self.set_property(path, SCHEMA_AT, f"{c.lsn}:{c.seq}")
            numbers = column_numbers(columns)
            if numbers:
                self.set_property(path, NUMBERS, json.dumps(numbers))
            return f"{name}: created"
        if (c.lsn, c.seq) <= self.schema_position(path):
            # Applied before (a replayed batch, or this DDL's copy from another
            # partition): the mirror may already be past it.
            return None
        changes = []
        recreated = str(ddl.get("tag", "")).upper() == "CREATE TABLE"
        if recreated and self.truncate(path, name, c.lsn):
            # Dropped and created again: the rows of the old table are gone.
            changes.append("re-created (rows of the dropped table removed)")
        current = self.columns(path)
        removed = [col for col in current if col not in after]
        added = {col: t for col, t in after.items() if col not in current}
        numbers = column_numbers(columns)
        known: dict[str, int] = json.loads(self.properties(path).get(NUMBERS, "{}"))
        # Columns of the event the mirror holds already, though no DDL it applied named
        # them: rows older than this DDL carrying its new names brought them (see _fold).
        early = [col for col in after if col in current and col not in known]
        # by column number, never guessed from the statement (shared.contract.ddl)
        statement = str(ddl.get("statement") or "")
        renames = ddl_renames(removed, [*added, *early], known, numbers, statement)
        folds = [(o, n) for o, n in renames if n not in added]
        renames = [(o, n) for o, n in renames if n in added]
        if folds:
            self.fold(path, current, folds)
        for old, new in folds:
            changes.append(f"column {old} renamed to {new} (merged into its early copy)")
            removed.remove(old)
        # Names for the renamed columns as for added ones: free of the kept columns' twins.
        kept = [f.name for c, f in current.items() if c not in removed]
        targets = mirror_names(kept, [n for _, n in renames])
        if renames:
            pairs = {current[o].name: targets[n] for o, n in renames}
            self.rewrite(path, lambda df: df.withColumnsRenamed(pairs))
        for old, new in renames:
            changes.append(f"column {old} renamed to {new}")
            removed.remove(old)
            added.pop(new)
        if removed:
            self.rewrite(path, lambda df: df.drop(*[current[c].name for c in removed]))
            changes.append(f"dropped {', '.join(removed)}")
        moved: dict[str, str | None] = {**dict(folds), **dict(renames)}
        self.unfilled_after(path, {**moved, **dict.fromkeys(removed)})
        widened = {
            col: spark_type(t)
            for col, t in after.items()
            if col in current and _widens(current[col].dataType, spark_type(t))
        }
        if widened:
            # int -> bigint, real -> double, anything -> text: rewritten with the wider
            # type, so later values fit instead of being quarantined one by one.
            self.rewrite(
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
            self.add_columns(path, kept + list(targets.values()), added)
            changes.append(f"added {', '.join(added)}")
        if numbers:
            self.set_property(path, NUMBERS, json.dumps(numbers))
        self.set_property(path, SCHEMA_AT, f"{c.lsn}:{c.seq}")
        return f"{name}: {'; '.join(changes)}" if changes else None

    def truncate(self, path: Path, name: str, lsn: int) -> str | None:
        if not self.exists(path):
            return None
        if lsn <= int(self.properties(path).get(TRUNCATED, "0")):
            return None  # applied before this batch was replayed
        # Only rows older than the truncate: under primary-key partitioning it reaches
        # every partition, and rows written after it may have been merged from another
        # partition first.
        self.spark.sql(f"DELETE FROM delta.{quote(str(path))} WHERE {LSN} < {int(lsn)}")
        self.set_property(path, TRUNCATED, str(lsn))
        return f"{name}: truncated"

    def snapshot(self, path: Path, name: str, c: Control) -> str | None:
        """A snapshot marker (docs/events.md, "Snapshots"). The start changes nothing. The
        end (version S = its LSN) says every row the table now has was delivered with a
        version >= S, so a mirror row older than S no longer exists in the source: it is
        removed, as by a truncate at S, except that the floor recorded is S - 1 so that
        the snapshot's own rows (version S, from other partitions) still land after it.
        A redelivered end marker, or its copy from another partition, does nothing."""
        info = c.snapshot or {}
        sid = info.get("id")
        if info.get("phase") == "range_end":
            return self.range_end(path, name, c)
        if info.get("phase") != "end":
            log.info("%s: snapshot %s started (version %d)", name, sid, c.lsn)
            return f"{name}: snapshot {sid} started"
        if not self.exists(path):
            return None  # no row of the table was ever mirrored: nothing older than S
        floor = c.lsn - 1
        if floor <= int(self.properties(path).get(TRUNCATED, "0")):
            return None  # applied before, or a truncate after the snapshot's start
        done = self.spark.sql(f"DELETE FROM delta.{quote(str(path))} WHERE {LSN} < {int(c.lsn)}")
        removed = _affected(done)
        self.set_property(path, TRUNCATED, str(floor))
        log.info(
            "%s: snapshot %s ended (version %d, %s rows delivered): %s rows older than it"
            " removed",
            name, sid, c.lsn, info.get("rows"), "?" if removed is None else removed,
        )  # fmt: skip
        gone = "" if removed is None else f"{removed} "
        return f"{name}: snapshot {sid} ended, {gone}rows older than it removed"

    def range_end(self, path: Path, name: str, c: Control) -> str | None:
        """The end of a snapshot of key ranges (shared/contract/keyranges.py; ``repair``):
        as a snapshot's end, but only for the rows whose key lies in its ranges — every
        row the source holds there was delivered at the marker's version or later, so an
        older mirror row there is of a row the source no longer has. Nothing outside the
        ranges changes and no floor is recorded: applied again it removes nothing more
        (each key's newer change or read row comes after its older ones)."""
        info = c.snapshot or {}
        sid = info.get("id")
        try:
            ranges = keyranges.parse(json.loads(str(info.get("key_ranges"))))
        except ValueError as exc:  # json's errors are ValueErrors too
            log.error("%s: snapshot %s's end marker ignored (nothing removed): %s", name, sid, exc)
            return f"{name}: snapshot {sid} key ranges malformed, ignored"
        if not self.exists(path):
            return None
        if c.lsn - 1 <= int(self.properties(path).get(TRUNCATED, "0")):
            return None  # truncated after the run's start: nothing older is left
        fields = self.columns(path)
        mirror = {pg: f.name for pg, f in fields.items()}
        missing = [col for col in ranges.columns if col not in mirror]
        if missing:
            log.error("%s: snapshot %s's key columns %s not in the mirror: nothing removed",
                      name, sid, missing)  # fmt: skip
            return f"{name}: snapshot {sid} key columns not mirrored, ignored"
        where = key_ranges_sql(
            [mirror[col] for col in ranges.columns],
            ranges,
            [fields[col].dataType for col in ranges.columns],
        )
        done = self.spark.sql(
            f"DELETE FROM delta.{quote(str(path))} WHERE {LSN} < {int(c.lsn)} AND ({where})"
        )
        removed = _affected(done)
        log.info(
            "%s: snapshot %s of %d key range(s) ended (version %d): %s rows older than it in"
            " them removed",
            name, sid, len(ranges.ranges), c.lsn, "?" if removed is None else removed,
        )  # fmt: skip
        gone = "" if removed is None else f"{removed} "
        return f"{name}: snapshot {sid} of key ranges ended, {gone}rows older than it removed"

    def fold(
        self, path: Path, current: dict[str, T.StructField], folds: list[tuple[str, str]]
    ) -> None:
        """Complete renames ``(old, new)`` whose ``new`` column the mirror holds already:
        each row keeps ``new`` where it has a value, else takes ``old``'s; ``old`` goes.

        How ``new`` got there before its DDL: a snapshot's ``read`` row is read from the
        table as it is when its chunk is read — after a rename that committed meanwhile —
        yet carries a version below that rename (the slot's restart position minus one),
        so in LSN order it sorts before the DDL, and ``Merger.merge`` added the column it
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

        self.rewrite(path, change)

    def unfilled_after(self, path: Path, moved: dict[str, str | None]) -> None:
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

    def rewrite(self, path: Path, change: Callable[[DataFrame], DataFrame]) -> None:
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


def key_ranges_sql(
    columns: list[str],
    ranges: keyranges.KeyRanges,
    types: Sequence[T.DataType] | None = None,
) -> str:
    """Spark SQL for "the key (``columns``, mirror names) is in one of ``ranges``", in the
    key's order (the tuple's; strings by code point, as Spark compares them). Values are
    checked integers or strings (keyranges.parse); a string is written as the hex of its
    UTF-8 bytes, so no value, whatever its characters, is read as anything but a value —
    and cast to the mirror column's type (``types``) where that is a date or a timestamp
    (a date or timestamp key's bound is its text: shared/contract/keyorder.py)."""
    casts = [_TIME_CASTS.get(type(t)) for t in (types or [T.StringType()] * len(columns))]

    def lit(i: int, v: int | str) -> str:
        if type(v) is int:
            return str(int(v))
        text = f"CAST(X'{str(v).encode().hex()}' AS STRING)"
        return text if casts[i] is None else f"CAST({text} AS {casts[i]})"

    def beyond(i: int, bound: keyranges.Bound, op: str) -> str:
        strict = ">" if op == ">" else "<"
        value = lit(i, bound[i])
        here = f"{quote(columns[i])} {op if i == len(columns) - 1 else strict} {value}"
        if i == len(columns) - 1:
            return here
        tail = beyond(i + 1, bound, op)
        return f"({here} OR ({quote(columns[i])} = {value} AND {tail}))"

    parts = []
    for lower, upper in ranges.ranges:
        conds = [beyond(0, lower, ">")] if lower is not None else []
        conds += [beyond(0, upper, "<=")] if upper is not None else []
        parts.append("(" + " AND ".join(conds) + ")" if conds else "TRUE")
    return " OR ".join(parts)


_TIME_CASTS: dict[type, str] = {
    T.DateType: "DATE",
    T.TimestampType: "TIMESTAMP",
    T.TimestampNTZType: "TIMESTAMP_NTZ",
}


def _affected(result: DataFrame) -> int | None:
    """The row count a Delta DELETE answers with (``num_affected_rows``), if it does."""
    if "num_affected_rows" not in result.columns:
        return None
    row = result.first()
    return None if row is None or row[0] is None else int(row[0])


def _widens(current: T.DataType, target: T.DataType) -> bool:
    return type(target) in _WIDENINGS.get(type(current), ())
