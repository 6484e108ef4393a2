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
from prometheus_client import CollectorRegistry, Gauge

from services.pg2kafka.admin import maintain_partitions
from services.pg2kafka.cdc import CdcStream
from services.pg2kafka.metrics import Metrics
from services.pg2kafka.session import Liveness
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.subscriptions import SubscriptionStream
from shared.service import Runner

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
    runner: Runner
    cdc: CdcStream
    events: SubscriptionStream | None = None

    @property
    def registry(self) -> CollectorRegistry:
        return self.runner.registry

    def run(self) -> None:
        """Run the CDC stream here and, with subscriptions enabled, the events stream and
        the partition maintenance beside it. The first to fail stops the others."""
        beside: list[tuple[str, Callable[[], None]]] = []
        if self.events is not None:
            maintenance = Maintenance(self.settings, self.runner.stop_event, self.events.metrics)
            beside = [("events", self.events.run), ("maintenance", maintenance.run)]
        self.runner.run(self.cdc.run, beside=beside)

    def stop(self, *_: object) -> None:
        self.runner.stop()

    def install_signal_handlers(self) -> None:
        self.runner.install_signal_handlers("after in-flight messages are acknowledged")


def readiness(live: Liveness, standby_within: float) -> tuple[bool, str]:
    """pg2kafka's ``/ready``: the leader streaming or reading its initial snapshot, or a
    standby that polled the leader lock within ``standby_within`` seconds. Not ready:
    between attempts after a failure, or a standby that lost its connection."""
    if live.streaming:
        return True, "leader: replication streaming"
    if live.snapshotting:  # before streaming; hours, on big tables
        return True, "leader: initial snapshot before streaming"
    if live.standby(standby_within):
        return True, "standby: another pg2kafka leads the slot"
    return False, "neither leading nor a standby polling the leader lock"


def events_readiness(live: Liveness, standby_within: float) -> tuple[bool, str]:
    """The subscription events stream's part of ``/ready``: its leader in any state (live,
    queueing through a Kafka outage, replaying, recovering a slot: all are its work), or
    a connected standby."""
    if live.leading:
        return True, "leader of the events stream"
    if live.standby(standby_within):
        return True, "standby of the events stream"
    return False, "events stream: neither leading nor a standby polling the leader lock"


def build(settings: Pg2KafkaSettings) -> Service:
    """Compose pg2kafka from its settings; nothing connects until ``run``."""
    runner = Runner(settings.http)
    stop = runner.stop_event
    cdc = CdcStream(settings, Metrics(runner.registry), stop)
    events: SubscriptionStream | None = None
    if settings.subscriptions.enabled:
        events = SubscriptionStream(
            settings, Metrics(runner.registry, prefix="walcast_pg2kafka_subscription"), stop
        )
    live = cdc.live
    runner.health("loop", lambda: (time.monotonic() - live.last_loop < 120, "main loop ticking"))
    # Ready: the leader streaming, or a standby that is connected and polling the lock
    # (a Deployment's rolling update waits for new pods to be ready, and a new pod starts
    # as the standby of the old leader; docs/deploy.md).
    standby_within = max(10.0, 3 * settings.replication.standby_poll_s)

    runner.ready("streaming", lambda: readiness(live, standby_within))
    role = Gauge(
        "walcast_pg2kafka_role",
        "1 for this process's role in the slot's leadership: leader (holds the lock:"
        " snapshotting or streaming) or standby (connected, waiting to take over)",
        ["role"],
        registry=runner.registry,
    )
    role.labels("leader").set_function(lambda: float(live.leading))
    role.labels("standby").set_function(lambda: float(live.standby(standby_within)))
    if events is not None:
        ev = events.live
        runner.health(
            "events_loop", lambda: (time.monotonic() - ev.last_loop < 120, "events loop ticking")
        )
        runner.ready("events_streaming", lambda: events_readiness(ev, standby_within))
    return Service(settings, runner, cdc, events)


__all__ = ["Maintenance", "Metrics", "Service", "build"]
