"""SearchPipeline when the group rebalances in the middle of a flush: nothing in hand for
the partitions this member keeps may be dropped (a later commit would skip it)."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from services.kafka2search.app import Metrics, Rejection, SearchPipeline
from services.kafka2search.documents import Batch, Origin
from services.kafka2search.engines import SearchEngine
from services.kafka2search.settings import Kafka2SearchSettings
from shared.contract.event import decode
from shared.kafka import KafkaOffsetCheckpointer
from tests.unit.kafka2search.conftest import SettingsFactory

TOPIC = "walcast.cdc"


class RebalancingConsumer(Consumer):  # type: ignore[misc]
    """Owns partitions 0 and 1; its first poll serves the revocation of partition 1 (as
    librdkafka serves rebalance callbacks from a poll) and then lets the write finish."""

    def __init__(self, pipeline: SearchPipeline, release: threading.Event) -> None:
        self.pipeline = pipeline
        self.release = release
        self.owned = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
        self.commits: list[dict[tuple[str, int], int]] = []

    def assignment(self) -> list[TopicPartition]:
        return list(self.owned)

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass

    def resume(self, partitions: list[TopicPartition]) -> None:
        pass

    def poll(self, timeout: float | None = None) -> None:
        if not self.release.is_set():
            revoked = [self.owned.pop()]
            self.pipeline._on_revoke(self, revoked)
            self.release.set()

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        self.commits.append({(t.topic, t.partition): t.offset for t in offsets})
        return None if asynchronous else offsets


class NoDeadLetters:
    def flush(self, timeout_s: float) -> None:
        pass


@pytest.fixture
def settings(settings_with: SettingsFactory) -> Kafka2SearchSettings:
    return settings_with(batch={"concurrency": 1}, kafka={"bootstrap_servers": "127.0.0.1:1"})


def take(pipeline: SearchPipeline, partition: int, offset: int, doc_id: int) -> None:
    value = orjson.dumps(
        {
            "v": 1, "op": "insert", "db": "app", "schema": "public", "table": "t",
            "lsn": 100 + offset, "key": {"id": doc_id}, "new": {"id": doc_id},
        }
    )  # fmt: skip
    origin = Origin(TOPIC, partition, offset, None, value)
    assert pipeline.batch.add("idx", decode(value), origin) is None
    pipeline._mark(TOPIC, partition, offset)


def test_a_revocation_served_while_a_flush_waits_keeps_the_batch_in_hand(
    settings: Kafka2SearchSettings,
) -> None:
    pipeline = SearchPipeline(
        settings, SearchEngine(client=None), Metrics(CollectorRegistry()), threading.Event()
    )
    release = threading.Event()
    written: list[set[str]] = []

    def write(
        batch: Batch, sleep: Any, before: tuple[Future[list[Rejection]], ...] = ()
    ) -> list[Rejection]:
        written.append({doc_id for _, doc_id in batch.docs})
        release.wait(10)  # the engine is slow: the next flush has to wait for this one
        return []

    consumer = RebalancingConsumer(pipeline, release)
    pipeline.indexer.write = write  # type: ignore[method-assign]
    pipeline.consumer = consumer
    pipeline.checkpointer = KafkaOffsetCheckpointer(consumer)
    pipeline.dlq.close()  # its producer is never used here
    pipeline.dlq = NoDeadLetters()  # type: ignore[assignment]
    pipeline.writer = ThreadPoolExecutor(1)
    try:
        take(pipeline, 0, 5, doc_id=1)
        pipeline.flush(drain=False)  # in flight, slow
        take(pipeline, 0, 6, doc_id=2)
        take(pipeline, 1, 3, doc_id=3)
        pipeline.flush(drain=False)  # waits for the first write; partition 1 is revoked
        pipeline.flush(drain=True)
    finally:
        pipeline.writer.shutdown(wait=True)
    assert written == [{"1"}, {"2", "3"}]  # the batch in hand was written, not dropped
    committed: dict[tuple[str, int], int] = {}
    for commit in consumer.commits:
        committed.update(commit)
    assert committed[(TOPIC, 0)] == 7  # past offset 6 only because it was written
