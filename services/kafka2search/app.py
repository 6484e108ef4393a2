"""kafka2search: CDC topic(s) → OpenSearch / Elasticsearch, in a Kafka consumer group,
wired in :func:`build`.

The consume / batch / write / commit loop is the shared one (:mod:`shared.consumer`:
offsets committed only after the bulk write that covers them, partitions paused while
the engine refuses writes, a flush on revocation, dead letters, lag). The sink it feeds
is :class:`~services.kafka2search.indexer.Indexer`; its parts: :mod:`.indices` (each
table's index), :mod:`.tables` (truncates, snapshot markers, schema changes),
:mod:`.documents` (the bulk batch), :mod:`.partial` (TOAST fills),
:mod:`shared.contract.moves` (rows older than a rename or drop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from services.kafka2search.documents import Batch
from services.kafka2search.engines import SearchEngine, engine_for
from services.kafka2search.indexer import Indexer
from services.kafka2search.metrics import PREFIX, Metrics
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.verify import continuous
from shared.cli import tune_gc_for_records
from shared.consumer import ConsumerLoop, ConsumerMetrics, LoopLink
from shared.records import configured_change_events
from shared.service import Runner
from shared.verify.continuous import Continuous, VerifyMetrics


@dataclass
class Service:
    settings: Kafka2SearchSettings
    runner: Runner
    loop: ConsumerLoop[Batch]
    indexer: Indexer
    engine: SearchEngine
    verifier: Continuous | None = None  # verify.interval_s

    @property
    def registry(self) -> CollectorRegistry:
        return self.runner.registry

    def run(self) -> None:
        tune_gc_for_records()
        if self.verifier is not None:
            self.verifier.start()
        self.runner.run(self.loop.run, cleanup=self.engine.close)

    def stop(self, *_: object) -> None:
        self.runner.stop()

    def install_signal_handlers(self) -> None:
        self.runner.install_signal_handlers("after the batch in hand")


def consumer_loop(
    settings: Kafka2SearchSettings,
    engine: SearchEngine,
    registry: CollectorRegistry,
    stop_event: threading.Event,
    *,
    group_id: str | None = None,
    start: Callable[[Consumer, list[TopicPartition]], None] | None = None,
    until: dict[tuple[str, int], int] | None = None,
) -> tuple[ConsumerLoop[Batch], Indexer]:
    """The shared consumer loop feeding an :class:`Indexer` (``run``, and ``replay`` with
    ``start`` / ``until``)."""
    link = LoopLink(stop_event)
    indexer = Indexer(settings, engine, Metrics(registry), link.wait)
    loop = ConsumerLoop[Batch](
        name="consume and index",
        kafka=settings.kafka,
        consumer=settings.consumer,
        batch=settings.batch,
        retry=settings.retry,
        metrics=ConsumerMetrics(registry, PREFIX),
        sink=indexer,
        link=link,
        stop_event=stop_event,
        group_id=group_id,
        start=start,
        until=until,
        decoder=configured_change_events(settings.consumer.input_format, settings.schema_registry),
    )
    return loop, indexer


def build(settings: Kafka2SearchSettings) -> Service:
    """Wire the service: engine adapter, the consumer loop and its indexer, metrics and
    the ops endpoint."""
    runner = Runner(settings.http)
    engine = engine_for(settings.engine)
    loop, indexer = consumer_loop(settings, engine, runner.registry, runner.stop_event)
    alive, consuming = loop.checks()
    runner.health("loop", alive)
    runner.ready("engine", lambda: (engine.ping(), engine.name))
    runner.ready("consuming", consuming)
    verifier = continuous(settings, engine, VerifyMetrics(runner.registry), runner.stop_event)
    return Service(settings, runner, loop, indexer, engine, verifier)


__all__ = ["Indexer", "Service", "build", "consumer_loop"]
