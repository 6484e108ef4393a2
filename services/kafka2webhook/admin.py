"""kafka2webhook's operator commands: ``status`` and ``replay``."""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from datetime import datetime
from functools import partial
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from services.kafka2webhook.app import PREFIX, endpoint_loop, record_headers
from services.kafka2webhook.delivery import DeliveryMetrics
from services.kafka2webhook.settings import EndpointSettings, Kafka2WebhookSettings
from shared.consumer import ConsumerMetrics
from shared.errors import ConfigError
from shared.kafka import group_lag, replay_range, topic_partitions
from shared.retry import call_with_retry

log = logging.getLogger(__name__)

DLQ_SCAN = 10_000
"""Dead letters read per partition (the newest) to count them per endpoint."""


def topics_of(settings: Kafka2WebhookSettings, endpoint: EndpointSettings) -> list[str]:
    return [settings.events_topic] if endpoint.input == "events" else list(settings.consumer.topics)


def group_of(settings: Kafka2WebhookSettings, endpoint: EndpointSettings) -> str:
    return f"{settings.consumer.group_id}.{endpoint.name}"


def dead_letters(settings: Kafka2WebhookSettings) -> dict[str, dict[str, Any]]:
    """Per endpoint, from the newest ``DLQ_SCAN`` records of each dead-letter partition:
    how many, and the last one's reason and time."""
    out: dict[str, dict[str, Any]] = {}
    c = Consumer({**settings.kafka.client_config(), "group.id": "walcast-webhook-status",
                  "enable.auto.commit": False})  # fmt: skip
    try:
        todo: dict[tuple[str, int], int] = {}
        assign = []
        for tp in topic_partitions(c, settings.consumer.dlq_topic):
            low, high = c.get_watermark_offsets(tp, timeout=10)
            if high > low:
                assign.append(TopicPartition(tp.topic, tp.partition, max(low, high - DLQ_SCAN)))
                todo[(tp.topic, tp.partition)] = high
        if not assign:
            return out
        c.assign(assign)
        idle = 0
        while todo and idle < 10:
            msgs = c.consume(1000, 1.0)
            idle = 0 if msgs else idle + 1
            for msg in msgs:
                if msg.error():
                    continue
                where = (msg.topic() or "", msg.partition() or 0)
                if (msg.offset() or 0) + 1 >= todo.get(where, 0):
                    todo.pop(where, None)
                headers = record_headers(msg)
                name = headers.get("walcast-endpoint", b"").decode()
                if not name:
                    continue
                entry = out.setdefault(name, {"count": 0})
                entry["count"] += 1
                entry["last_reason"] = headers.get("walcast-error", b"").decode("utf-8", "replace")
                entry["last_at_ms"] = msg.timestamp()[1]
    finally:
        c.close()
    return out


def live(settings: Kafka2WebhookSettings, url: str | None) -> dict[str, Any] | None:
    """The running service's ``/status`` (delivered, failing, last error), or None when
    it does not answer."""
    url = url or f"http://{settings.http.host}:{settings.http.port}/status"
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 - the operator's URL
            found: dict[str, Any] = orjson.loads(resp.read())
            return found
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _lag(settings: Kafka2WebhookSettings, endpoint: EndpointSettings) -> list[dict[str, Any]]:
    c = Consumer({**settings.kafka.client_config(), "group.id": group_of(settings, endpoint)})
    try:
        return group_lag(c, topics_of(settings, endpoint))
    finally:
        c.close()


def status(settings: Kafka2WebhookSettings, url: str | None = None) -> dict[str, Any]:
    """Per endpoint: lag (from its group's offsets), dead letters (from the dead-letter
    topic) and, when the service answers at ``url``, delivered / failing / last error."""
    running = live(settings, url)
    letters = call_with_retry(
        lambda: dead_letters(settings), policy=settings.retry, what="read the dead letters"
    )
    endpoints = []
    for e in settings.endpoints:
        lag = call_with_retry(
            partial(_lag, settings, e), policy=settings.retry, what=f"read {e.name}'s offsets"
        )
        state = (running or {}).get(e.name, {})
        endpoints.append(
            {
                "endpoint": e.name,
                "url": e.url,
                "group": group_of(settings, e),
                "lag": sum(p["lag"] for p in lag),
                "partitions": lag,
                "dead_letters": letters.get(e.name, {"count": 0}),
                "delivered": state.get("delivered"),
                "failing": state.get("failing"),
                "failing_for_s": state.get("failing_for_s"),
                "last_error": state.get("last_error"),
            }
        )
    return {"service_answered": running is not None, "endpoints": endpoints}


def replay(
    settings: Kafka2WebhookSettings,
    endpoint_name: str,
    *,
    from_offset: int | None = None,
    from_timestamp: datetime | None = None,
    partitions: list[int] | None = None,
) -> int:
    """Deliver again to one endpoint what its topics hold from an offset or a time up to
    their end now (its subscription, filter and order apply as in ``run``; deliveries
    carry their usual ``webhook-id``, so receivers that de-duplicate see no change). The
    endpoint's committed offsets are not touched. Returns the records read."""
    found = [e for e in settings.endpoints if e.name == endpoint_name]
    if not found:
        raise ConfigError(
            f"no endpoint {endpoint_name!r}",
            hint=f"use one of {[e.name for e in settings.endpoints]}",
        )
    if (from_offset is None) == (from_timestamp is None):
        raise ConfigError("give exactly one of --from-offset and --from-timestamp")
    endpoint = found[0]
    start, until = call_with_retry(
        lambda: replay_range(
            settings.kafka.client_config(),
            topics_of(settings, endpoint),
            from_offset,
            from_timestamp,
            partitions,
        ),
        policy=settings.retry,
        what="find the replay's offsets",
    )
    start = [tp for tp in start if tp.offset < until[(tp.topic, tp.partition)]]
    until = {(tp.topic, tp.partition): until[(tp.topic, tp.partition)] for tp in start}
    total = sum(until[(tp.topic, tp.partition)] - tp.offset for tp in start)
    log.info("replay to %s: %d records from %d partitions", endpoint.name, total, len(start))
    if not start:
        return 0
    registry = CollectorRegistry()
    e = endpoint_loop(
        settings, endpoint,
        ConsumerMetrics(registry, PREFIX, member_label="webhook"),
        DeliveryMetrics(registry, PREFIX), threading.Event(),
        group_id=f"{group_of(settings, endpoint)}-replay",
        start=lambda consumer, _parts: consumer.assign(start), until=until,
    )  # fmt: skip
    try:
        e.loop.run()
    finally:
        e.deliverer.close()
    return total
