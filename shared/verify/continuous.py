"""``verify.interval_s`` inside a sink's ``run``: one table verified every interval, the
tables in rotation, its outcome in metrics and where ``status`` reads it.

It runs on its own thread beside the consumer loop, reads only (Postgres in short
transactions at ``verify.rows_per_s`` at most, the sink through its own requests), and a
verification that fails — Postgres away, a marker that does not come — is counted and
logged, never stops the service: the next interval tries the next table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.verify.run import TableReport

log = logging.getLogger(__name__)

RESULTS = ("checked", "missing", "extra", "differs", "unknown", "changing")


class VerifyMetrics:
    """What the continuous mode exports (the alert "sink differs from source" and the
    dashboard's verify panel read them)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows = Counter(
            "walcast_verify_rows",
            "Rows verified, by table and result: checked (all rows of the table), and the"
            " rows found missing, extra, differing, of unknown hash, still changing",
            ["table", "result"],
            registry=registry,
        )
        self.differences = Gauge(
            "walcast_verify_differences",
            "Rows the table's last finished verification found missing, extra or differing"
            " (0: the sink equals its source; rows of unknown hash are not counted)",
            ["table"],
            registry=registry,
        )
        self.last_success = Gauge(
            "walcast_verify_last_success_timestamp",
            "Unix time of the table's last verification that found the sink equal",
            ["table"],
            registry=registry,
        )
        self.failures = Counter(
            "walcast_verify_failures",
            "Verifications that could not finish (the reason is logged)",
            ["table"],
            registry=registry,
        )

    def record(self, report: TableReport) -> None:
        name = ".".join(report.table)
        counts = {
            "checked": report.rows,
            "missing": len(report.missing),
            "extra": len(report.extra),
            "differs": len(report.differs),
            "unknown": len(report.unknown),
            "changing": len(report.changing),
        }
        for result, n in counts.items():
            self.rows.labels(table=name, result=result).inc(n)
        differing = counts["missing"] + counts["extra"] + counts["differs"]
        self.differences.labels(table=name).set(differing)
        if report.ok:
            self.last_success.labels(table=name).set(time.time())


class Continuous:
    """Every ``interval_s``: the next of ``tables()`` verified by ``verify_one``; each
    finished report handed to ``record`` (what ``status`` shows) and the metrics."""

    def __init__(
        self,
        interval_s: float,
        tables: Callable[[], Sequence[tuple[str, str]]],
        verify_one: Callable[[tuple[str, str]], TableReport],
        metrics: VerifyMetrics,
        record: Callable[[dict[str, Any]], None],
        stop: threading.Event,
    ) -> None:
        self.interval_s = interval_s
        self.tables = tables
        self.verify_one = verify_one
        self.metrics = metrics
        self.record = record
        self.stop = stop
        self.turn = 0
        self.thread = threading.Thread(target=self.run, name="verify", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def once(self) -> dict[str, Any] | None:
        """Verify the next table in rotation; its outcome (None: no table yet)."""
        try:
            tables = list(self.tables())
        except Exception as exc:  # noqa: BLE001 - logged, retried next interval
            log.warning("verify: could not list the tables: %s", exc)
            return None
        if not tables:
            return None
        table = tables[self.turn % len(tables)]
        self.turn += 1
        name = ".".join(table)
        try:
            report = self.verify_one(table)
        except Exception as exc:  # noqa: BLE001 - the service goes on; counted and logged
            self.metrics.failures.labels(table=name).inc()
            log.warning("verify of %s did not finish: %s", name, exc)
            outcome = {"table": name, "ok": None, "error": str(exc)[:500], "at": time.time()}
            self.record(outcome)
            return outcome
        self.metrics.record(report)
        outcome = {**report.as_dict(), "at": time.time()}
        (log.info if report.ok else log.error)(
            "verify of %s: %s", name, "equal" if report.ok else f"DIFFERS {outcome}"
        )
        self.record(outcome)
        return outcome

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.once()
