"""Spark starts offline with the stack's jars, reads Kafka with its own source, writes Delta
that an independent reader (delta-rs) can read."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable


@pytest.fixture
def spark(stack_env: dict[str, str]):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[1]")
        .appName("walcast-stack-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.jars", stack_env["WALCAST_SPARK_JARS"])
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .getOrCreate()
    )
    yield session
    session.stop()


def test_kafka_to_delta(spark, stack_env: dict[str, str], unique_name: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bootstrap = stack_env["WALCAST_KAFKA_BOOTSTRAP"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(unique_name, 2, 1)])[unique_name].result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(50):
            producer.produce(unique_name, key=str(i), value=f'{{"n": {i}}}')
        assert producer.flush(30) == 0

        df = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", unique_name)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "offset")
        )
        path = str(tmp_path / "delta")
        df.write.format("delta").save(path)
        assert spark.read.format("delta").load(path).count() == 50

        table = DeltaTable(path)
        assert table.version() == 0
        rows = table.to_pyarrow_table().to_pylist()
        assert sorted(int(r["k"]) for r in rows) == list(range(50))
    finally:
        admin.delete_topics([unique_name])[unique_name].result(timeout=30)
