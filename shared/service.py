"""The process around a service's work, the same for all three services.

:class:`Runner` owns what every service's ``run`` needs besides its work: the metrics
registry, the ops endpoint (``/metrics``, ``/health``, ``/ready``; off when
``http.enabled`` is false), the stop event that SIGTERM / SIGINT set, and the threads of
work running beside the main one — the first of them to fail stops the others, and its
error is what ``run`` raises. A service's ``build(settings)`` creates one, registers its
health and readiness checks, and hands it its work; its ``__main__`` calls
:func:`serve`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry

from shared.cli import stop_on_signals
from shared.http import OpsServer
from shared.settings import HttpSettings, ServiceSettings

Check = Callable[[], tuple[bool, str]]


class Runner:
    """Ops endpoint, signals, stop event and side threads of one service process."""

    def __init__(self, http: HttpSettings, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.stop_event = threading.Event()
        self.ops = OpsServer(self.registry, http.host, http.port) if http.enabled else None

    def health(self, name: str, check: Check) -> None:
        """A liveness check: fails only when a restart would help."""
        if self.ops is not None:
            self.ops.add_health_check(name, check)

    def ready(self, name: str, check: Check) -> None:
        """A readiness check, with the failing reason."""
        if self.ops is not None:
            self.ops.add_ready_check(name, check)

    def status(self, report: Callable[[], object]) -> None:
        """The service's live state at ``/status`` (JSON; cheap, no I/O)."""
        if self.ops is not None:
            self.ops.status = report

    def run(
        self,
        main: Callable[[], None],
        *,
        beside: Sequence[tuple[str, Callable[[], None]]] = (),
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        """Serve the ops endpoint and run ``main`` on this thread and each of ``beside``
        on its own; the first to fail (or a signal) stops the others. ``cleanup`` runs
        last, whatever happened; the first failure is raised."""
        errors: list[BaseException] = []

        def guarded(work: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                try:
                    work()
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)
                    self.stop_event.set()

            return run

        if self.ops is not None:
            self.ops.start()
        threads = [threading.Thread(target=guarded(w), name=n, daemon=True) for n, w in beside]
        try:
            for thread in threads:
                thread.start()
            guarded(main)()
        finally:
            self.stop_event.set()
            for thread in threads:
                thread.join(60)
            try:
                if self.ops is not None:
                    self.ops.stop()
            finally:
                if cleanup is not None:
                    cleanup()
        if errors:
            raise errors[0]

    def stop(self, *_: object) -> None:
        self.stop_event.set()

    def install_signal_handlers(self, what: str) -> None:
        """SIGTERM / SIGINT stop the service; ``what`` (for the log) says what it
        finishes first."""
        stop_on_signals(self.stop, what)


class Service(Protocol):
    """What a service's ``build`` returns."""

    def run(self) -> None: ...

    def stop(self, *_: object) -> None: ...

    def install_signal_handlers(self) -> None: ...


def serve(prog: str, settings: ServiceSettings, build: Callable[[], Service]) -> None:
    """The ``run`` command of every service: log the effective configuration (secrets
    masked) under the program's name, build, stop on signals, run until stopped."""
    logging.getLogger(prog).info("starting", extra={"config": settings.effective()})
    service = build()
    service.install_signal_handlers()
    service.run()
