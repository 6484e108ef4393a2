"""kafka2spark against real Kafka, Spark (local) and Delta, fed by a pg2kafka harness.

One Spark session for the whole run (a JVM start costs ~10 s); each test has its own
Delta root under tmp_path, its own checkpoint and consumer group."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from services.kafka2spark.app import Service, build, spark_session
from services.kafka2spark.mirror import BatchResult, DeltaMirror
from services.kafka2spark.settings import Kafka2SparkSettings
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.settings import VerifySettings, load_settings


def spark_settings(env_file: Path, root: Path, name: str, topic: str) -> Kafka2SparkSettings:
    return load_settings(
        Kafka2SparkSettings,
        env_file=env_file,
        source={"topics": [topic], "group_id": f"{name}-group"},
        delta={"root": str(root)},
        trigger={"mode": "available_now"},
        http={"enabled": False},
        log={"format": "text"},
    )


@pytest.fixture(scope="session")
def spark(stack_env: dict[str, str]) -> Iterator[SparkSession]:
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    settings = load_settings(Kafka2SparkSettings, env_file=env_file)
    # One JVM for every integration test: thousands of streaming queries' stages and
    # plans over the session. Its default 1 GB heap ran out in the suite's ~100th Spark
    # test (stage 6,402, a first micro-batch of a pgbench load): 2 GB for the session.
    conf = {**settings.spark.conf, "spark.driver.memory": "2g"}
    settings = settings.model_copy(
        update={"spark": settings.spark.model_copy(update={"conf": conf})}
    )
    session = spark_session(settings)
    yield session
    session.stop()


class Mirror:
    """One test's kafka2spark: the streaming query (``run``) or the batch function fed
    directly (``feed``), over the same settings."""

    def __init__(self, spark: SparkSession, settings: Kafka2SparkSettings) -> None:
        self.spark = spark
        self.settings = settings
        self.results: list[BatchResult] = []

    def run(self, timeout: float = 300) -> Service:
        """The streaming query with ``availableNow``: everything in the topic now, then it
        stops by itself."""
        service = build(self.settings, self.spark)
        inner = service.mirror.on_batch

        def record(result: BatchResult) -> None:
            inner(result)
            self.results.append(result)

        service.mirror.on_batch = record
        query = service.start()
        try:
            assert query.awaitTermination(timeout), f"the query did not finish in {timeout}s"
            failure = query.exception()
            assert failure is None, str(failure)
        finally:
            if query.isActive:
                query.stop()
            service.committer.close()
        return service

    def feed(self, batch_id: int, partitions: list[int] | None = None) -> BatchResult:
        """Read the topic (or only ``partitions`` of it) as one DataFrame (Spark's Kafka
        source, batch mode) and hand it to the mirror as micro-batch ``batch_id``."""
        reader = self.spark.read.format("kafka")
        from services.kafka2spark.app import kafka_source_options

        for key, value in kafka_source_options(self.settings.kafka).items():
            reader = reader.option(key, value)
        topics = self.settings.source.topics
        if partitions is None:
            reader = reader.option("subscribe", ",".join(topics))
        else:
            reader = reader.option("assign", json.dumps({topics[0]: partitions}))
        df = reader.load()
        got: list[BatchResult] = []
        DeltaMirror(self.spark, self.settings, got.append)(df, batch_id)
        return got[0]

    def path(self, table: str, schema: str = "public") -> Path:
        return self.settings.delta.root / f"{schema}.{table}"


MirrorFactory = Callable[[str], Mirror]


@pytest.fixture
def make_mirror(
    spark: SparkSession, env_file: Path, tmp_path: Path, unique_name: str
) -> Iterator[MirrorFactory]:
    made: list[Mirror] = []

    def make(topic: str) -> Mirror:
        m = Mirror(spark, spark_settings(env_file, tmp_path / "delta", unique_name, topic))
        made.append(m)
        return m

    yield make
    for m in made:
        group = m.settings.source.group_id
        client = AdminClient(m.settings.kafka.client_config())
        with contextlib.suppress(Exception):  # a group never committed to does not exist
            client.delete_consumer_groups([group])[group].result(30)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def verify_settings(m: Mirror, source: Pg2KafkaSettings, range_rows: int) -> Kafka2SparkSettings:
    """The mirror's settings with a ``verify`` section reading ``source``'s database."""
    return m.settings.model_copy(
        update={
            "verify": VerifySettings(
                postgres=source.postgres,
                slot=source.replication.slot,
                range_rows=range_rows,
                mark_timeout_s=240,
            )
        }
    )
