"""What a producer of change events needs to know of Kafka: the stream a session
writes (:class:`StreamTarget`), each topic's partitions and largest record
(:class:`Topics`), and the producer's settings. Shared by the sessions and the snapshot
readers; kept apart from both so a reader process imports only what it uses."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from services.pg2kafka.output import output_format
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.kafka import BulkKafkaSink, KafkaSink, ensure_topic, topic_max_message_bytes

log = logging.getLogger(__name__)

# Below a topic's max.message.bytes: the record's framing and headers.
RECORD_OVERHEAD = 1024


class Topics:
    """What a producer learns once per topic: its partition count and the largest event
    value it takes; creates the topic first when configured to (its
    ``max.message.bytes`` set to the producer's limit, so a large row is not refused by a
    broker default of ~1 MB)."""

    def __init__(self, settings: Pg2KafkaSettings, sink: KafkaSink | BulkKafkaSink) -> None:
        self.settings = settings
        self.sink = sink
        self.partitions: dict[str, int] = {}  # topic -> partition count, learnt once
        self.max_value_bytes: dict[str, int] = {}  # topic -> largest value it takes

    def ensure(self, topic: str) -> int:
        """The topic's partition count, learnt once."""
        count = self.partitions.get(topic)
        if count is None:
            prod = self.settings.producer
            config = self.settings.kafka.client_config()
            if prod.create_topic:
                ensure_topic(
                    config,
                    topic,
                    prod.topic_partitions,
                    prod.topic_replication_factor,
                    {"max.message.bytes": str(prod.max_message_bytes)},
                )
            # Just created: the brokers' metadata may lag behind for a moment.
            wait = 10.0 if prod.create_topic else 0.0
            count = self.partitions[topic] = self.sink.partitions(topic, wait)
            topic_limit = topic_max_message_bytes(config, topic)
            limit = min(prod.max_message_bytes, topic_limit or prod.max_message_bytes)
            # Room for the key, headers and the record's framing.
            self.max_value_bytes[topic] = limit - RECORD_OVERHEAD
            if topic_limit is not None and topic_limit < prod.max_message_bytes:
                log.info(
                    "topic %s takes records up to %d bytes (its max.message.bytes); larger"
                    " changes are sent as references",
                    topic,
                    topic_limit,
                )
        return count

    def value_limit(self, topic: str) -> int:
        """The largest event value ``topic`` takes."""
        limit = self.max_value_bytes.get(topic)
        if limit is None:
            self.ensure(topic)
            limit = self.max_value_bytes[topic]
        return limit

    def refresh(self, topic: str) -> int:
        """Ask Kafka again (partitions may have been added since start)."""
        count = self.partitions[topic] = self.sink.partitions(topic)
        return count


def producer_config(settings: Pg2KafkaSettings) -> dict[str, object]:
    """The change producer's librdkafka settings (idempotence and acks=all are added by
    :class:`~shared.kafka.KafkaSink`)."""
    s = settings
    config: dict[str, object] = {
        **s.kafka.client_config(),
        "linger.ms": s.producer.linger_ms,
        "batch.size": s.producer.batch_bytes,
        "batch.num.messages": s.producer.batch_messages,
        "compression.type": s.producer.compression,
        "message.timeout.ms": s.producer.delivery_timeout_ms,
        "message.max.bytes": s.producer.max_message_bytes,
    }
    partitioner = output_format(s).partitioner
    if partitioner is not None:
        config["partitioner"] = partitioner
    return config


@dataclass(frozen=True)
class StreamTarget:
    """Which slot a session streams and where its messages go."""

    slot: str
    publication: str
    topic: str
    topic_template: str | None = None

    @classmethod
    def cdc(cls, settings: Pg2KafkaSettings) -> StreamTarget:
        return cls(
            settings.replication.slot,
            settings.replication.publication,
            settings.producer.topic,
            settings.producer.topic_template,
        )

    @classmethod
    def subscription_events(cls, settings: Pg2KafkaSettings) -> StreamTarget:
        sub = settings.subscriptions
        return cls(sub.slot, sub.publication, sub.topic)
