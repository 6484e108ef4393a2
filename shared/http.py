"""The operational HTTP endpoint every service exposes: /metrics, /health, /ready.

* ``/metrics``: Prometheus text format from the service's registry.
* ``/health``:  liveness. 200 while every registered health check passes; 503 otherwise.
  Kubernetes restarts the pod on repeated 503, so a check must only fail when a restart
  would help (a wedged main loop), never because a dependency is down.
* ``/ready``:   readiness. 200 once every readiness check passes (connected, streaming);
  503 with the failing checks' reasons otherwise.
* ``/status``:  a service's own live state as JSON, when it registered one (kafka2webhook:
  per endpoint delivered, failing, last error); 404 otherwise.

Checks are callables returning ``(ok, detail)``; they run on the server thread, so they
must be cheap (read a flag or a timestamp, never do I/O).

The same checks are also metrics, evaluated at each scrape (waiting a second at most):
``walcast_ready`` and ``walcast_healthy`` (1 or 0, what the endpoints would answer) and
``walcast_ready_check`` per readiness check, so an alert can say which one fails without
probing the pod.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

Check = Callable[[], tuple[bool, str]]


class OpsServer:
    """Serves the three endpoints on a daemon thread; ``start`` / ``stop`` from the service."""

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> None:
        self.registry = registry
        self._health: dict[str, Check] = {}
        self._ready: dict[str, Check] = {}
        self.status: Callable[[], object] | None = None
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None
        registry.register(_ChecksCollector(self))

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def add_health_check(self, name: str, check: Check) -> None:
        self._health[name] = check

    def add_ready_check(self, name: str, check: Check) -> None:
        self._ready[name] = check

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ops-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @staticmethod
    def _run(checks: dict[str, Check]) -> tuple[bool, dict[str, dict[str, object]]]:
        results: dict[str, dict[str, object]] = {}
        for name, check in checks.items():
            try:
                ok, detail = check()
            except Exception as exc:  # noqa: BLE001 - a broken check fails, it is not a 500
                ok, detail = False, f"check raised {type(exc).__name__}: {exc}"
            results[name] = {"ok": ok, "detail": detail}
        return all(r["ok"] for r in results.values()), results

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                elif path in ("/health", "/ready"):
                    ok, results = server._run(
                        server._health if path == "/health" else server._ready
                    )
                    body = orjson.dumps({"status": "ok" if ok else "failing", "checks": results})
                    self._send(200 if ok else 503, body, "application/json")
                elif path == "/status" and server.status is not None:
                    self._send(200, orjson.dumps(server.status()), "application/json")
                else:
                    self._send(404, b'{"error":"not found"}', "application/json")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # scrapes every few seconds would drown the service's own log

        return Handler


class _ChecksCollector(Collector):
    """The checks as gauges, evaluated when Prometheus scrapes. A check should be cheap,
    but some ask a dependency (kafka2search's pings the engine, bounded by its request
    timeout): a scrape waits at most ``WAIT_S`` for the evaluation and otherwise reports
    the last finished one, so a slow dependency never makes ``/metrics`` time out (and
    the service look down) when it is only not ready."""

    WAIT_S = 1.0

    def __init__(self, server: OpsServer) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last: tuple[bool, bool, dict[str, dict[str, object]]] | None = None

    def _evaluate(self) -> None:
        ready, checks = self.server._run(self.server._ready)
        healthy, _ = self.server._run(self.server._health)
        self._last = (ready, healthy, checks)

    def collect(self) -> list[GaugeMetricFamily]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._evaluate, name="ops-checks", daemon=True
                )
                self._thread.start()
            thread = self._thread
        thread.join(self.WAIT_S)
        if self._last is None:
            return []  # the first evaluation is still running: nothing known yet
        ready, healthy, checks = self._last
        per_check = GaugeMetricFamily(
            "walcast_ready_check", "1 when this readiness check passes", labels=["check"]
        )
        for name, result in checks.items():
            per_check.add_metric([name], 1.0 if result["ok"] else 0.0)
        return [
            GaugeMetricFamily(
                "walcast_ready", "1 when every readiness check passes (/ready answers 200)",
                value=float(ready),
            ),
            GaugeMetricFamily(
                "walcast_healthy", "1 when every liveness check passes (/health answers 200)",
                value=float(healthy),
            ),
            per_check,
        ]  # fmt: skip
