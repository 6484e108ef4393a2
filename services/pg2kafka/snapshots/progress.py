"""A run's progress: the log every ``snapshot.progress_interval_s``, a bar on a terminal
before streaming starts, and the metrics."""

from __future__ import annotations

import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.snapshots.chunks import (
    Job,
)

if TYPE_CHECKING:  # a reader process needs no metrics (prometheus_client: 12 MB)
    from services.pg2kafka.metrics import Metrics

log = logging.getLogger(__name__)


class Progress:
    """The run log, a progress bar on a terminal, and the metrics, every
    ``progress_interval_s`` (the bar every second)."""

    def __init__(self, settings: Pg2KafkaSettings, metrics: Metrics, job: Job) -> None:
        self.interval = settings.snapshot.progress_interval_s
        self.metrics = metrics
        self.job = job
        self.started = time.monotonic()
        self.first_rows: int | None = None
        self.last_log = 0.0
        self.tty = sys.stderr.isatty() and job.kind == "initial"  # a bar only before streaming

    def report(self, tables: list[dict[str, Any]], final: bool = False) -> None:
        now = time.monotonic()
        done = sum(t["rows"] for t in tables)
        if self.first_rows is None:
            self.first_rows = done  # rows of an earlier run: not this run's speed
        estimate = sum(max(t["estimate"] or 0, t["rows"]) for t in tables)
        elapsed = max(now - self.started, 1e-6)
        rate = (done - self.first_rows) / elapsed
        eta = (estimate - done) / rate if rate > 0 and estimate > done else None
        chunks_left = sum(t["chunks"] - t["chunks_done"] for t in tables)
        for t in tables:
            self.metrics.snapshot_rows.labels(t["table"]).set(t["rows"])
            self.metrics.snapshot_rows_estimate.labels(t["table"]).set(t["estimate"] or 0)
            self.metrics.snapshot_chunks_left.labels(t["table"]).set(t["chunks"] - t["chunks_done"])
        self.metrics.snapshot_rate.set(rate)
        if self.tty:
            share = done / estimate if estimate else 1.0
            bar = "#" * int(30 * min(share, 1.0))
            sys.stderr.write(
                f"\rsnapshot [{bar:<30}] {share:6.1%} {done:,}/{estimate:,} rows"
                f" {rate:,.0f}/s ETA {format_eta(eta)} "
            )
            if final:
                sys.stderr.write("\n")
            sys.stderr.flush()
        if final or now - self.last_log >= self.interval:
            self.last_log = now
            for t in tables:
                if t["state"] != "running" and not final:
                    continue
                log.info(
                    "snapshot %s: %s", t["table"], t["state"],
                    extra={"snapshot": self.job.id, "table": t["table"], "rows": t["rows"],
                           "estimate": t["estimate"],
                           "chunks_left": t["chunks"] - t["chunks_done"]},
                )  # fmt: skip
            log.info(
                "snapshot %d: %d of ~%d rows, %.0f rows/s, ETA %s, %d chunks left",
                self.job.id, done, estimate, rate, format_eta(eta), chunks_left,
                extra={"snapshot": self.job.id, "rows": done, "estimate": estimate,
                       "rows_per_s": round(rate), "eta_s": None if eta is None else round(eta),
                       "chunks_left": chunks_left},
            )  # fmt: skip


def format_eta(eta: float | None) -> str:
    if eta is None:
        return "-"
    minutes, seconds = divmod(int(eta), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
