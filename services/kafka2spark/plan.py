"""A batch's plan: its control events per table (copies of one collapsed), and its data
events cut into segments by those that change the mirror — each segment one MERGE,
each such control event applied between the segments around it, in LSN order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from services.kafka2spark import append_only
from services.kafka2spark.names import TKEY
from shared.contract.event import CONTROL_OPS, DATA_OPS


@dataclass
class Control:
    """One truncate, DDL, snapshot or verification marker of the batch (``table``: db.schema.table;
    ``event``: its db, schema and table)."""

    table: str
    lsn: int
    seq: int
    op: str
    ddl: dict[str, Any] | None
    event: dict[str, str]
    snapshot: dict[str, Any] | None = None


def plan(
    events: DataFrame,
) -> tuple[
    dict[str, list[Control]],
    DataFrame,
    dict[str, dict[str, Any]],
    dict[tuple[str, int], list[str]],
    dict[tuple[str, int], int],
]:
    """The batch's control events per table, its data events cut into segments by
    them (persisted: the caller unpersists), and per (table, segment) the column
    types and key columns — three small Spark jobs."""
    controls = [
        Control(
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
    by_table: dict[str, list[Control]] = {}
    for c in distinct(controls):
        by_table.setdefault(c.table, []).append(c)

    # Only events that change the mirror cut its rows into segments (a segment is one
    # MERGE): a snapshot's start, or a table's drop, merely recorded, do not.
    cutting = {t: [c for c in ctl if cuts(c)] for t, ctl in by_table.items()}
    data = events.where(F.col("op").isin(*DATA_OPS)).withColumn("segment", segment_expr(cutting))
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


def distinct(controls: list[Control]) -> Iterator[Control]:
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


def cuts(c: Control) -> bool:
    """Whether a control event changes the mirror, so the rows before it are merged
    before it is applied: a truncate, a snapshot's end, a schema change (not a table's
    drop, which keeps the mirror, nor a snapshot's start, which is only recorded, nor a
    verification marker)."""
    if c.op == "verify":
        return False
    if c.op == "snapshot":
        return (c.snapshot or {}).get("phase") in ("end", "range_end")
    if c.op == "ddl":
        return not (c.ddl or {}).get("dropped")
    return True


def segment_expr(by_table: dict[str, list[Control]]) -> Column:
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
