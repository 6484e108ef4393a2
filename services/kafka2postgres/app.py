"""kafka2postgres: CDC topic(s) → another PostgreSQL database, in a Kafka consumer group,
wired in :func:`build`.

The consume / batch / write / commit loop is the shared one (:mod:`shared.consumer`:
offsets committed only after the target transaction that covers them committed,
partitions paused while the target is out of reach, dead letters, lag). The sink it feeds
is :class:`~services.kafka2postgres.applier.Applier`; its parts: :mod:`.batch` (the
newest change per key), :mod:`.statements` (one set-based statement per table and
batch), :mod:`.tables` (target tables, their floors and schema changes), :mod:`.schema`
(a table's schema from the event's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from services.kafka2postgres.applier import Applier
from services.kafka2postgres.batch import Batch
from services.kafka2postgres.metrics import PREFIX, Metrics
from services.kafka2postgres.settings import Kafka2PostgresSettings
from shared.cli import tune_gc_for_records
from shared.consumer import ConsumerLoop, ConsumerMetrics, LoopLink
from shared.records import configured_change_events
from shared.service import Runner


@dataclass
class Service:
    settings: Kafka2PostgresSettings
    runner: Runner
    loop: ConsumerLoop[Batch]
    applier: Applier

    @property
    def registry(self) -> CollectorRegistry:
        return self.runner.registry

    def run(self) -> None:
        tune_gc_for_records()
        self.runner.run(self.loop.run, cleanup=self.applier.close)

    def stop(self, *_: object) -> None:
        self.runner.stop()

    def install_signal_handlers(self) -> None:
        self.runner.install_signal_handlers("after the transaction in hand")


def consumer_loop(
    settings: Kafka2PostgresSettings,
    registry: CollectorRegistry,
    stop_event: threading.Event,
    *,
    group_id: str | None = None,
    start: Callable[[Consumer, list[TopicPartition]], None] | None = None,
    until: dict[tuple[str, int], int] | None = None,
) -> tuple[ConsumerLoop[Batch], Applier]:
    """The shared consumer loop feeding an :class:`Applier` (``run``, and ``replay`` with
    ``start`` / ``until``)."""
    link = LoopLink(stop_event)
    applier = Applier(settings, Metrics(registry), link.wait)
    loop = ConsumerLoop[Batch](
        name="consume and apply",
        kafka=settings.kafka,
        consumer=settings.consumer,
        batch=settings.batch,
        retry=settings.retry,
        metrics=ConsumerMetrics(registry, PREFIX),
        sink=applier,
        link=link,
        stop_event=stop_event,
        group_id=group_id,
        start=start,
        until=until,
        decoder=configured_change_events(settings.consumer.input_format, settings.schema_registry),
    )
    return loop, applier


def build(settings: Kafka2PostgresSettings) -> Service:
    """Wire the service: the consumer loop and its applier, metrics and the ops
    endpoint."""
    runner = Runner(settings.http)
    loop, applier = consumer_loop(settings, runner.registry, runner.stop_event)
    alive, consuming = loop.checks()
    runner.health("loop", alive)
    runner.ready("target", applier.ping)
    runner.ready("consuming", consuming)
    return Service(settings, runner, loop, applier)


__all__ = ["Applier", "Service", "build", "consumer_loop"]
