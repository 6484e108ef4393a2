"""Postgres column types (as change events carry them) → Spark SQL types.

The mirror keeps every value without loss, so where Spark has no exact equivalent the
value stays text: ``numeric`` (arbitrary precision, ``NaN``) is a string holding the exact
decimal; ``json`` / ``jsonb`` hold the JSON text; intervals, times, money, UUIDs, enums
and anything unknown are strings as pg2kafka sends them (docs/events.md, Values).
Arrays (``_elem``) are arrays of the element type.
"""

from __future__ import annotations

from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from shared.contract import pgtypes

# Spark SQL type names (as the type table spells them) → Spark types.
_BY_NAME: dict[str, T.DataType] = {
    t.simpleString(): t
    for t in (
        T.ShortType(), T.IntegerType(), T.LongType(), T.FloatType(), T.DoubleType(),
        T.BooleanType(), T.DateType(), T.TimestampNTZType(), T.TimestampType(),
        T.BinaryType(), T.StringType(),
    )
}  # fmt: skip


def spark_type(pg_type: str) -> T.DataType:
    """The column type of a Postgres type as events carry it (:mod:`shared.contract.pgtypes`):
    arrays (``_elem``) are arrays of the element's type; types outside the table, strings."""
    row, is_array = pgtypes.by_name(pg_type)
    element = _BY_NAME[row.spark if row is not None else pgtypes.UNKNOWN_SPARK]
    return T.ArrayType(element) if is_array else element


# The change event envelope (docs/events.md). ``key`` / ``new`` / ``old`` are declared as
# strings: Spark's JSON reader keeps a nested object's raw JSON text in a string field,
# and each table's rows are parsed later with that table's own schema.
ENVELOPE = T.StructType(
    [
        T.StructField("v", T.LongType()),
        T.StructField("op", T.StringType()),
        T.StructField("db", T.StringType()),
        T.StructField("schema", T.StringType()),
        T.StructField("table", T.StringType()),
        T.StructField("lsn", T.LongType()),
        T.StructField("seq", T.LongType()),
        T.StructField("commit_lsn", T.LongType()),
        T.StructField("xid", T.LongType()),
        T.StructField("commit_ts", T.StringType()),
        T.StructField("key", T.StringType()),
        T.StructField("new", T.StringType()),
        T.StructField("old", T.StringType()),
        T.StructField("unchanged_toast", T.ArrayType(T.StringType())),
        T.StructField("hash", T.LongType()),
        T.StructField("types", T.MapType(T.StringType(), T.StringType())),
        T.StructField(
            "ddl",
            T.StructType(
                [
                    T.StructField("tag", T.StringType()),
                    T.StructField("statement", T.StringType()),
                    T.StructField(
                        "columns",
                        T.ArrayType(
                            T.StructType(
                                [
                                    T.StructField("name", T.StringType()),
                                    T.StructField("type", T.StringType()),
                                ]
                            )
                        ),
                    ),
                    T.StructField("primary_key", T.ArrayType(T.StringType())),
                    T.StructField("dropped", T.BooleanType()),
                ]
            ),
        ),
        T.StructField("oversized", T.LongType()),
        T.StructField(
            "snapshot",
            T.StructType(
                [
                    T.StructField("id", T.LongType()),
                    T.StructField("chunk", T.LongType()),
                    T.StructField("phase", T.StringType()),
                    T.StructField("rows", T.LongType()),
                    # range_end: the object as JSON text (Spark keeps a nested value read
                    # as a string as its JSON), checked where it is applied
                    T.StructField("key_ranges", T.StringType()),
                ]
            ),
        ),
        T.StructField("epoch", T.LongType()),
        T.StructField("append_only", T.BooleanType()),
        T.StructField("verify", T.StructType([T.StructField("id", T.StringType())])),
    ]
)
