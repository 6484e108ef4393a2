"""kafka2search's metrics (the consumer loop's own — records, dead letters, lag — are
:class:`~shared.consumer.ConsumerMetrics` under the same prefix)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

PREFIX = "walcast_kafka2search"


class Metrics:
    """The indexer's metrics; the loop's own (records, dead letters, lag) are
    :class:`~shared.consumer.ConsumerMetrics` under the same prefix."""

    def __init__(self, registry: CollectorRegistry, prefix: str = PREFIX) -> None:
        self.docs = Counter(
            f"{prefix}_documents", "documents written, by action", ["action"], registry=registry
        )
        self.stale = Counter(
            f"{prefix}_stale_events",
            "changes not newer than the stored document of their row (version conflict): skipped",
            registry=registry,
        )
        self.unfilled = Counter(
            f"{prefix}_unfilled_documents",
            "documents written without unchanged TOAST values neither the batch nor the"
            " index had (recorded in the document, for an older row to fill)",
            registry=registry,
        )
        self.filled = Counter(
            f"{prefix}_filled_documents",
            "documents whose unfilled columns a row older than them filled",
            registry=registry,
        )
        # Kept apart from `stale`: a row the index does not hold is never counted stale.
        self.below_floor = Counter(
            f"{prefix}_below_floor_events",
            "changes at or below their table's floor (its last truncate, creation or"
            " snapshot end, after which the index removed what was older): skipped",
            registry=registry,
        )
        self.retries = Counter(
            f"{prefix}_retries", "bulk requests or items retried", registry=registry
        )
        self.bulk_seconds = Histogram(
            f"{prefix}_bulk_seconds",
            "bulk request latency",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.indices_lost = Counter(
            f"{prefix}_indices_lost",
            "indices found deleted outside walcast (the service stops with what to do)",
            registry=registry,
        )
        self.schema_changes = Counter(
            f"{prefix}_schema_changes", "truncates, DDL and snapshot markers applied to indices",
            ["kind"],
            registry=registry,
        )  # fmt: skip
