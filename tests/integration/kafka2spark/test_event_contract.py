"""kafka2spark's envelope (Spark's JSON reader + the mirror's validation) and the
contract's decoder reach the same verdict on every docs example and every kind of
poison."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from services.kafka2spark import envelope
from services.kafka2spark.schema import ENVELOPE
from shared.contract import event
from tests.unit.test_event_contract import doc_examples

GOOD = [json.dumps(e).encode() for e in doc_examples()]
BASE = {"v": 1, "op": "insert", "db": "d", "schema": "s", "table": "t", "lsn": 1, "seq": 0,
        "commit_lsn": 1, "xid": 1, "commit_ts": "2026-01-01T00:00:00Z", "key": {"id": 1},
        "new": {"id": 1}}  # fmt: skip
MARKER = {k: v for k, v in BASE.items() if k not in ("key", "new")} | {
    "op": "snapshot", "snapshot": {"id": 3, "phase": "start"},
}  # fmt: skip
POISON = [
    b"not json",
    b"[1, 2]",
    json.dumps(BASE | {"v": 2}).encode(),
    json.dumps(BASE | {"op": "heartbeat"}).encode(),
    json.dumps(BASE | {"op": "message"}).encode(),
    json.dumps({k: v for k, v in BASE.items() if k != "table"}).encode(),
    json.dumps(BASE | {"lsn": -1}).encode(),
    json.dumps({k: v for k, v in BASE.items() if k != "key"}).encode(),
    json.dumps(BASE | {"new": None}).encode(),
    json.dumps(BASE | {"op": "ddl"}).encode(),
    # a reference pg2kafka sends for a change larger than Kafka accepts
    json.dumps(BASE | {"new": None, "oversized": 20_000_000}).encode(),
    # snapshots: a read row without its row or with a snapshot that is no object, and
    # markers without a valid snapshot object
    json.dumps(BASE | {"op": "read", "new": None}).encode(),
    json.dumps(BASE | {"op": "read", "snapshot": 3}).encode(),
    json.dumps(BASE | {"op": "read", "snapshot": [3]}).encode(),
    json.dumps(MARKER | {"snapshot": None}).encode(),
    json.dumps(MARKER | {"snapshot": "end"}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": 3}}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": 3, "phase": "middle"}}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": 3, "phase": 5}}).encode(),
    json.dumps(MARKER | {"snapshot": {"phase": "end", "rows": 1}}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": "3", "phase": "end"}}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": 3.5, "phase": "end"}}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": True, "phase": "end"}}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": -1, "phase": "end"}}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": 2**63, "phase": "end"}}).encode(),
]
# Not in the docs examples: a read row without its snapshot, a marker without key / rows.
MORE_GOOD = [
    json.dumps(BASE | {"op": "read", "xid": 0}).encode(),
    json.dumps(BASE | {"op": "read", "snapshot": None}).encode(),
    json.dumps(MARKER | {"snapshot": {"id": 0, "phase": "end"}}).encode(),
]


def spark_verdicts(spark: SparkSession, values: list[bytes]) -> list[str | None]:
    df = spark.createDataFrame([(v,) for v in values], "value binary")
    parsed = df.withColumn("e", F.from_json(F.col("value").cast("string"), ENVELOPE))
    rows = parsed.withColumn("reason", envelope.reason()).select("reason").collect()
    return [r["reason"] for r in rows]


def decoder_verdict(value: bytes) -> str | None:
    try:
        event.decode(value)
    except event.EventDecodeError as exc:
        return str(exc)
    return None


def test_both_consumers_accept_every_docs_example(spark: SparkSession) -> None:
    good = GOOD + MORE_GOOD
    assert [decoder_verdict(v) for v in good] == [None] * len(good)
    assert spark_verdicts(spark, good) == [None] * len(good)


@pytest.mark.parametrize("value", POISON, ids=lambda v: v.decode()[:40])
def test_both_consumers_refuse_the_same_poison(spark: SparkSession, value: bytes) -> None:
    assert decoder_verdict(value) is not None
    (reason,) = spark_verdicts(spark, [value])
    assert reason is not None
