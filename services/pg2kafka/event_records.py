"""The records of the subscription events topic, and whether Kafka answers.

Shared by the live and queueing sessions (:mod:`.subscriptions`) and the replay
(:mod:`.replay`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from services.pg2kafka.metrics import Metrics
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.transforms import Transforms
from shared.errors import RetriableError
from shared.kafka import Outgoing

log = logging.getLogger(__name__)


class KafkaUnavailableError(RetriableError):
    """Kafka has not acknowledged anything for ``failover_after_s`` (or cannot be reached)."""


def event_message(
    topic: str,
    row: dict[str, Any],
    key_field: str | None,
    lsn: int | None,
    transforms: Transforms | None = None,
) -> Outgoing | None:
    """The Kafka record for one events row: value = payload (rewritten by the transform
    rules of its table), key, metadata headers."""
    payload = row.get("payload")
    if not isinstance(payload, str):
        return None
    if transforms is not None:
        payload = transformed_payload(payload, transforms)
    headers: list[tuple[str, bytes]] = [
        ("walcast-event-id", str(row.get("id")).encode()),
        ("walcast-stream-id", str(row.get("stream_id")).encode()),
        ("walcast-created-at", str(row.get("created_at")).encode()),
    ]
    if lsn is not None:
        headers.append(("walcast-lsn", str(lsn).encode()))
    metadata = row.get("metadata")
    headers.extend(metadata_headers(metadata if isinstance(metadata, str) else None))
    return Outgoing(topic, event_key(payload, key_field), payload.encode(), headers)


def transformed_payload(payload: str, transforms: Transforms) -> str:
    """The payload with its ``new`` / ``old`` images rewritten by the rules of the table
    it came from (:meth:`Transforms.payload`); the same text when no rule applies."""
    doc = _loads(payload)
    if isinstance(doc, dict) and transforms.payload(doc):
        return _dumps(doc).decode()
    return payload


def metadata_headers(metadata: str | None) -> list[tuple[str, bytes]]:
    """An events row's metadata object as headers: strings as their text, other values as
    JSON."""
    if metadata is None:
        return []
    meta = _loads(metadata)
    if not isinstance(meta, dict):
        return []
    return [(str(k), v.encode() if isinstance(v, str) else _dumps(v)) for k, v in meta.items()]


class _Number(str):
    """A JSON number beyond a double's range, kept as its literal text."""


def _loads(text: str) -> Any:
    """Parse a payload from Postgres: jsonb holds numbers of any size (``1e309``), which
    orjson refuses (that stopped the events stream and CDC with it). The rare payload
    orjson cannot read is parsed again with numbers kept as their literal text."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text, parse_float=_Number, parse_int=_Number, parse_constant=_Number)


def fit(out: Outgoing, limit: int) -> Outgoing | None:
    """``out`` when the topic takes it; else None: the caller sends :func:`reference`."""
    size = len(out.value or b"") + (len(out.key) if out.key else 0)
    return out if size <= limit else None


def reference(out: Outgoing, row: dict[str, Any]) -> Outgoing:
    """What goes in place of an event too large for the topic: its id, stream and size
    (the headers and key stay), so consumers see the gap and the operator can fetch the
    event from ``_walcast.events`` by id."""
    body = {
        "walcast_oversized": {
            "bytes": len(out.value or b""),
            "event_id": row.get("id"),
            "stream_id": row.get("stream_id"),
            "created_at": str(row.get("created_at")),
        }
    }
    return Outgoing(out.topic, out.key, orjson.dumps(body, default=str), out.headers)


def too_large(out: Outgoing, row: dict[str, Any], metrics: Metrics) -> Outgoing:
    """The :func:`reference` for an event its topic does not take, counted and logged."""
    metrics.oversized.inc()
    log.warning(
        "subscription event %s is %d bytes, more than topic %s takes: sent as a reference",
        row.get("id"),
        len(out.value or b""),
        out.topic,
    )
    return reference(out, row)


def event_key(payload: str, key_field: str | None) -> bytes | None:
    doc = _loads(payload)
    if not isinstance(doc, dict):
        return None
    if key_field:
        node: Any = doc
        for part in key_field.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node.encode() if isinstance(node, str) else _dumps(node)
    name = doc.get("tg_name")
    return name.encode() if isinstance(name, str) else None


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_as_fragment, option=orjson.OPT_PASSTHROUGH_SUBCLASS)


def _as_fragment(value: Any) -> orjson.Fragment:
    if isinstance(value, _Number):
        return orjson.Fragment(str.__str__(value))
    raise TypeError(type(value).__name__)


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
