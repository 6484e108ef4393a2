"""What a Kafka record is to the mirror: translated into walcast events where it is in
another format (Avro through the registry, Debezium), and the verdict on each — a change
event, or the reason it goes to the quarantine."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from shared.avro import RegistryDecoder
from shared.contract import limits
from shared.contract.event import (
    CONTROL_OPS,
    DATA_OPS,
    EPOCH_SHIFT,
    EVENT_VERSION,
    MAX_EPOCH,
    MAX_EPOCH_LSN,
)
from shared.contract.event import SNAPSHOT_PHASES as PHASES
from shared.formats.debezium_input import is_debezium
from shared.formats.debezium_input import translate as debezium_translate
from shared.settings import SchemaRegistrySettings

ORIGIN = ("topic", "partition", "offset", "kafka_ts")
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


def reason() -> Column:
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
            F.lit("snapshot 'phase' missing or not 'start', 'end' or 'range_end'"),
        )
        .when(
            (F.col("e.op") == "snapshot")
            & (F.col("e.snapshot.id").isNull() | (F.col("e.snapshot.id") < 0)),
            F.lit("snapshot 'id' missing or not an integer from 0 to 2^63-1"),
        )
    )
