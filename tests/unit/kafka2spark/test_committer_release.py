"""A closed ``GroupCommitter`` lets its Kafka client go. py4j keeps every foreachBatch
function — and with it the committer — for the JVM's lifetime; a client, even closed,
holds one of the process's pthread keys (1,024 at most) until it is freed. A process
that starts many queries (the integration suite does) ran out of them: every Kafka
client created afterwards failed with "Failed to initialize thread local storage"."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from services.kafka2spark.app import GroupCommitter, Metrics
from services.kafka2spark.settings import Kafka2SparkSettings

QUERIES = 1_100  # more than the keys there are


def test_closed_committers_kept_alive_hold_no_client() -> None:
    settings = Kafka2SparkSettings.model_validate(
        {"kafka": {"bootstrap_servers": "127.0.0.1:9"}, "source": {"group_id": "g"}}
    )
    metrics = Metrics(CollectorRegistry())
    kept: list[GroupCommitter] = []  # as py4j's pool keeps them
    for i in range(QUERIES):
        committer = GroupCommitter(settings, metrics)  # a client: raises once keys run out
        committer.close()
        assert not hasattr(committer, "consumer"), f"committer {i} still holds its client"
        kept.append(committer)
    assert len(kept) == QUERIES
