"""kafka2postgres's metrics (the consumer loop's own — records, dead letters, lag — are
:class:`~shared.consumer.ConsumerMetrics` under the same prefix)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "walcast_kafka2postgres"


class Metrics:
    """The applier's metrics."""

    def __init__(self, registry: CollectorRegistry, prefix: str = PREFIX) -> None:
        self.rows = Counter(
            f"{prefix}_rows",
            "target rows written, by action (insert, update, delete, fill: a partial row's"
            " missing columns filled by an older row)",
            ["action"],
            registry=registry,
        )
        self.stale = Counter(
            f"{prefix}_stale_events",
            "changes not newer than the version the target holds of their row (deleted rows"
            " included): skipped",
            registry=registry,
        )
        self.below_floor = Counter(
            f"{prefix}_below_floor_events",
            "changes at or below their table's floor (its last truncate, creation or"
            " snapshot end): skipped",
            registry=registry,
        )
        self.copy_batches = Counter(
            f"{prefix}_copy_batches",
            "batches of one table's new rows tried on the bulk path (COPY), by outcome:"
            " copied; held_key (the target held one of the keys), converted (a value that"
            " needs converting: a date BC) or refused (a value or a constraint the target"
            " refused): applied the guarded way",
            ["outcome"],
            registry=registry,
        )
        self.write_seconds = Histogram(
            f"{prefix}_write_seconds",
            "one batch's target transaction, from its first statement to its commit",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.schema_changes = Counter(
            f"{prefix}_schema_changes", "DDL events applied to target tables", registry=registry
        )
        self.stopped = Gauge(
            f"{prefix}_tables_stopped",
            "tables stopped by an error the operator must fix (their records dead-lettered)",
            registry=registry,
        )
