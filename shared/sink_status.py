"""What the ``status`` command of every sink on the shared consumer loop reports first:
its consumer group's lag per partition and the size of its dead-letter topic."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer

from shared.kafka import group_lag, topic_records
from shared.retry import BackoffPolicy, call_with_retry
from shared.settings import ConsumerSettings, KafkaSettings


def group_status(
    kafka: KafkaSettings, consumer: ConsumerSettings, retry: BackoffPolicy
) -> dict[str, Any]:
    """``group``, ``lag`` (per partition), ``total_lag`` and ``dead_letters`` of the
    sink's group, read with a consumer of its own (never joining the group). Kafka's
    transient refusals — a brand-new broker answers NOT_COORDINATOR until its group
    coordinator loaded — are retried under ``retry``; what outlasts it raises."""
    c = Consumer({**kafka.client_config(), "group.id": consumer.group_id})
    try:
        lag = call_with_retry(
            lambda: group_lag(c, list(consumer.topics)),
            policy=retry,
            what="read the group's offsets",
        )
        dlq = call_with_retry(
            lambda: topic_records(c, consumer.dlq_topic),
            policy=retry,
            what="read the dead-letter topic's size",
        )
    finally:
        c.close()
    return {
        "group": consumer.group_id,
        "lag": lag,
        "total_lag": sum(p["lag"] for p in lag),
        "dead_letters": dlq,
    }
