"""pg2kafka wired together: ``build(settings)`` composes the service from its parts.

* :mod:`.session` — one replication session: slot → handler → Kafka, checkpoint last;
* :mod:`.cdc` — the CDC stream (change events, keys, topics, DDL in-stream);
* :mod:`.subscriptions` — the subscription events stream, a state machine (live,
  queueing, replaying, recovering) over sessions and :mod:`.replay`;
* :mod:`.postgres` — the catalog, the leader lock, heartbeats;
* :class:`Maintenance` (here) — event partitions and the quarantine gauge on a timer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from prometheus_client import CollectorRegistry

from services.pg2kafka.admin import maintain_partitions
from services.pg2kafka.cdc import CdcStream
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.subscriptions import SubscriptionStream
from shared.cli import stop_on_signals
from shared.http import OpsServer

log = logging.getLogger(__name__)


class Maintenance:
    """Creates and drops event partitions every ``maintenance_interval_s``, whether or not
    events flow (the reference design only maintained while events arrived), and keeps the
    quarantined-events gauge current (every ``QUARANTINE_POLL_S`` at most)."""

    QUARANTINE_POLL_S = 15.0

    def __init__(self, settings: Pg2KafkaSettings, stop: threading.Event, metrics: Metrics) -> None:
        self.settings = settings
        self.stop = stop
        self.metrics = metrics

    def run(self) -> None:
        interval = self.settings.subscriptions.maintenance_interval_s
        due = 0.0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.settings.postgres.conninfo(), autocommit=True) as c:
                    if time.monotonic() >= due:
                        done = maintain_partitions(c, self.settings)
                        due = time.monotonic() + interval
                        log.info("partition maintenance", extra={"result": done})
                        if done.get("kept"):
                            log.warning(
                                "partitions past retention kept: they hold undelivered events",
                                extra={"kept": done["kept"]},
                            )
                    row = c.execute(
                        "SELECT count(*) FROM _walcast.subscription_errors WHERE stream_id = %s",
                        [self.settings.subscriptions.stream_id],
                    ).fetchone()
                    self.metrics.quarantined.set(row[0] if row else 0)
            except psycopg.Error as exc:
                log.warning("partition maintenance failed, retrying next round: %s", exc)
            self.stop.wait(min(interval, self.QUARANTINE_POLL_S))


@dataclass
class Service:
    settings: Pg2KafkaSettings
    registry: CollectorRegistry
    cdc: CdcStream
    ops: OpsServer | None
    stop_event: threading.Event

    events: SubscriptionStream | None = None

    def run(self) -> None:
        """Run the CDC stream here and, with subscriptions enabled, the events stream and
        the partition maintenance beside it. The first to fail stops the others."""
        if self.ops is not None:
            self.ops.start()
        threads: list[threading.Thread] = []
        errors: list[BaseException] = []

        def guarded(target: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    target()
                except BaseException as exc:  # noqa: BLE001 - re-raised by run()
                    errors.append(exc)
                    self.stop_event.set()

            return run

        if self.events is not None:
            maintenance = Maintenance(self.settings, self.stop_event, self.events.metrics)
            for name, target in (("events", self.events.run), ("maintenance", maintenance.run)):
                thread = threading.Thread(target=guarded(target), name=name, daemon=True)
                thread.start()
                threads.append(thread)
        try:
            guarded(self.cdc.run)()
        finally:
            self.stop_event.set()
            for thread in threads:
                thread.join(60)
            if self.ops is not None:
                self.ops.stop()
        if errors:
            raise errors[0]

    def stop(self, *_: object) -> None:
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        stop_on_signals(self.stop, "after in-flight messages are acknowledged")


def build(settings: Pg2KafkaSettings) -> Service:
    """Compose pg2kafka from its settings; nothing connects until ``run``."""
    registry = CollectorRegistry()
    stop_event = threading.Event()
    cdc = CdcStream(settings, Metrics(registry), stop_event)
    events: SubscriptionStream | None = None
    if settings.subscriptions.enabled:
        events = SubscriptionStream(
            settings, Metrics(registry, prefix="walcast_pg2kafka_subscription"), stop_event
        )
    ops: OpsServer | None = None
    if settings.http.enabled:
        ops = OpsServer(registry, settings.http.host, settings.http.port)
        live = cdc.live
        ops.add_health_check(
            "loop", lambda: (time.monotonic() - live.last_loop < 120, "main loop ticking")
        )
        ops.add_ready_check("streaming", lambda: (live.streaming, "replication streaming"))
        if events is not None:
            ev = events.live
            ops.add_health_check(
                "events_loop",
                lambda: (time.monotonic() - ev.last_loop < 120, "events loop ticking"),
            )
            ops.add_ready_check("events_streaming", lambda: (ev.streaming, "events streaming"))
    return Service(settings, registry, cdc, ops, stop_event, events)


__all__ = ["Maintenance", "Metrics", "Service", "build"]
