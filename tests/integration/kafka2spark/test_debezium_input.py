"""kafka2spark reading Debezium records (``source.input_format``): under ``auto`` a topic
holding both Debezium records and walcast events mirrors both; a tombstone is nothing to
apply; a record without its schema goes to the quarantine as it came, with the reason.
(The real connector's topics feed it in tests/e2e/test_debezium_sinks.py.)"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from shared.kafka import ensure_topic
from tests.integration.kafka2spark.conftest import Mirror, MirrorFactory

FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "version": 1, "parameters": {"scale": "2"}, "field": "amount"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1,
     "field": "day"},
]  # fmt: skip


def debezium(op: str, schema: str, before: Any, after: Any, lsn: int) -> tuple[bytes, bytes]:
    row = {"type": "struct", "fields": FIELDS, "optional": True}
    source = {"db": "walcast", "schema": schema, "table": "dbz", "lsn": lsn, "txId": 1,
              "ts_us": 1_700_000_000_000_000}  # fmt: skip
    value = {
        "schema": {"type": "struct", "fields": [{**row, "field": "before"},
                                                {**row, "field": "after"}]},
        "payload": {"before": before, "after": after, "source": source, "op": op},
    }  # fmt: skip
    image = after if after is not None else before
    key = {"schema": {"type": "struct", "fields": FIELDS[:1]}, "payload": {"id": image["id"]}}
    return orjson.dumps(key), orjson.dumps(value)


def test_debezium_records_and_walcast_events_mirror_side_by_side(
    make_mirror: MirrorFactory, spark: SparkSession, unique_name: str
) -> None:
    topic = f"{unique_name}.mixed"
    made = make_mirror(topic)
    s = made.settings
    settings = s.model_copy(update={"source": s.source.model_copy(update={"input_format": "auto"})})
    m = Mirror(spark, settings)
    ensure_topic(s.kafka.client_config(), topic, 1, 1)
    schema = unique_name
    p = Producer(s.kafka.client_config())
    records = [
        # 12.50 as Connect's Decimal (unscaled 1250, big-endian), 2024-02-29 as days
        debezium("r", schema, None, {"id": 1, "name": "a", "amount": "BOI=", "day": 19782}, 10),
        debezium("c", schema, None, {"id": 2, "name": "b", "amount": None, "day": None}, 20),
        debezium("u", schema, None, {"id": 1, "name": "a2", "amount": "BOI=", "day": 19782}, 30),
        debezium("d", schema, {"id": 2, "name": None, "amount": None, "day": None}, None, 40),
    ]
    for key, value in records:
        p.produce(topic, value, key)
    p.produce(topic, None, records[-1][0])  # the delete's tombstone
    schemaless = orjson.dumps(orjson.loads(records[1][1])["payload"])
    p.produce(topic, schemaless, b"k")
    walcast = {"v": 1, "op": "insert", "db": "walcast", "schema": schema, "table": "own",
               "lsn": 50, "seq": 0, "commit_lsn": 50, "xid": 1,
               "commit_ts": "2024-01-01T00:00:00Z", "key": {"id": 7}, "new": {"id": 7},
               "types": {"id": "int4"}}  # fmt: skip
    p.produce(topic, orjson.dumps(walcast), b"w")
    assert p.flush(30) == 0
    m.run()
    root = Path(settings.delta.root)
    rows = DeltaTable(str(root / f"{schema}.dbz")).to_pyarrow_table().to_pylist()
    mirrored = [{k: v for k, v in r.items() if not k.startswith("_walcast")} for r in rows]
    assert mirrored == [{"id": 1, "name": "a2", "amount": "12.50", "day": date(2024, 2, 29)}]
    own = DeltaTable(str(root / f"{schema}.own")).to_pyarrow_table().to_pylist()
    assert [r["id"] for r in own] == [7]
    q = DeltaTable(str(root / "_quarantine")).to_pyarrow_table().to_pylist()
    assert [(r["value"], r["key"]) for r in q] == [(schemaless, b"k")]
    assert "without its schema" in q[0]["reason"]
