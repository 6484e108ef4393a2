"""The records of the subscription events topic, and whether Kafka answers.

Shared by the live and queueing sessions (:mod:`.subscriptions`) and the replay
(:mod:`.replay`).
"""

from __future__ import annotations

from typing import Any

import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from services.pg2kafka.settings import Pg2KafkaSettings
from shared.errors import RetriableError
from shared.kafka import Outgoing


class KafkaUnavailableError(RetriableError):
    """Kafka has not acknowledged anything for ``failover_after_s`` (or cannot be reached)."""


def event_message(
    topic: str, row: dict[str, Any], key_field: str | None, lsn: int | None
) -> Outgoing | None:
    """The Kafka record for one events row: value = payload, key, metadata headers."""
    payload = row.get("payload")
    if not isinstance(payload, str):
        return None
    headers: list[tuple[str, bytes]] = [
        ("walcast-event-id", str(row.get("id")).encode()),
        ("walcast-stream-id", str(row.get("stream_id")).encode()),
        ("walcast-created-at", str(row.get("created_at")).encode()),
    ]
    if lsn is not None:
        headers.append(("walcast-lsn", str(lsn).encode()))
    metadata = row.get("metadata")
    if isinstance(metadata, str):
        meta = orjson.loads(metadata)
        if isinstance(meta, dict):
            for k, v in meta.items():
                headers.append((str(k), v.encode() if isinstance(v, str) else orjson.dumps(v)))
    return Outgoing(topic, event_key(payload, key_field), payload.encode(), headers)


def event_key(payload: str, key_field: str | None) -> bytes | None:
    doc = orjson.loads(payload)
    if not isinstance(doc, dict):
        return None
    if key_field:
        node: Any = doc
        for part in key_field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return (node if isinstance(node, str) else orjson.dumps(node).decode()).encode()
    name = doc.get("tg_name")
    return name.encode() if isinstance(name, str) else None


def kafka_answers(settings: Pg2KafkaSettings, topic: str, admin: AdminClient | None = None) -> bool:
    """A metadata request for the events topic within a second. Reuse ``admin``: a client
    created per probe takes seconds to tear down while the brokers are away."""
    admin = admin or AdminClient({**settings.kafka.client_config(), "socket.timeout.ms": 1000})
    try:
        md = admin.list_topics(topic, timeout=1)
    except KafkaException:
        return False
    meta = md.topics.get(topic)
    return meta is not None and meta.error is None and bool(md.brokers)
