"""pg2kafka's metrics: one set per stream (CDC, subscription events), told apart by
their prefix."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """One pipeline's metrics; ``prefix`` keeps two pipelines of a process apart."""

    def __init__(self, registry: CollectorRegistry, prefix: str = "walcast_pg2kafka") -> None:
        self.events = Counter(
            f"{prefix}_events", "change events produced", ["op"], registry=registry
        )
        self.bytes = Counter(f"{prefix}_bytes", "event bytes produced", registry=registry)
        self.transactions = Counter(
            f"{prefix}_transactions", "transactions fully acknowledged", registry=registry
        )
        self.skipped = Counter(
            f"{prefix}_skipped_no_identity",
            "changes skipped: table without replica identity",
            registry=registry,
        )
        self.replayed = Counter(
            f"{prefix}_replayed_events", "events sent from the replay queue", registry=registry
        )
        self.undecodable = Counter(
            f"{prefix}_undecodable_values",
            "text values that were not UTF-8, decoded by replication.invalid_text",
            registry=registry,
        )
        self.oversized = Counter(
            f"{prefix}_oversized_events",
            "changes larger than their topic takes, sent as references without their rows",
            registry=registry,
        )
        self.replay_missing = Counter(
            f"{prefix}_replay_missing_events",
            "queued events no longer in the events table when replayed (their partition"
            " was dropped): not delivered",
            registry=registry,
        )
        self.replay_remaining = Gauge(
            f"{prefix}_replay_remaining", "events waiting in the replay queue", registry=registry
        )
        self.failovers = Counter(
            f"{prefix}_failovers",
            "times the stream switched to queueing because Kafka was unavailable",
            registry=registry,
        )
        self.slot_recoveries = Counter(
            f"{prefix}_slot_recoveries",
            "invalidated slots recreated, undelivered events queued from the events table",
            registry=registry,
        )
        self.unconverted = Counter(
            f"{prefix}_unconverted_values",
            "column values sent as their text because conversion failed",
            registry=registry,
        )
        self.malformed = Counter(
            f"{prefix}_malformed_messages",
            "logical messages with the DDL prefix that were not valid DDL messages (skipped)",
            registry=registry,
        )
        self.unauthenticated_messages = Counter(
            f"{prefix}_unauthenticated_messages",
            "logical messages with a walcast prefix that walcast did not sign (ignored)",
            registry=registry,
        )
        self.inflight = Gauge(
            f"{prefix}_inflight_bytes",
            "bytes handed to Kafka, not yet acknowledged",
            registry=registry,
        )
        self.inflight_limit = Gauge(
            f"{prefix}_inflight_limit_bytes",
            "the memory guard: in-flight bytes at which reading the slot pauses"
            " (producer.max_inflight_bytes)",
            registry=registry,
        )
        self.retained_wal = Gauge(
            f"{prefix}_slot_retained_wal_bytes",
            "WAL the server keeps for the slot: its position minus the slot's restart_lsn",
            registry=registry,
        )
        self.confirmed = Gauge(
            f"{prefix}_confirmed_lsn", "LSN confirmed to the slot", registry=registry
        )
        self.epoch = Gauge(
            f"{prefix}_source_epoch",
            "the source's epoch the CDC stream's events carry: it grows when pg2kafka finds a"
            " restored or promoted database (docs/snapshots.md)",
            registry=registry,
        )
        self.quarantined = Gauge(
            f"{prefix}_quarantined_events",
            "subscription events in _walcast.subscription_errors (failed at the application's"
            " commit, kept instead of failing it)",
            registry=registry,
        )
        self.keyless_tables = Gauge(
            f"{prefix}_tables_without_identity",
            "tables the filters match that are not streamed: no primary key or replica"
            " identity (filters.keyless_tables=skip)",
            registry=registry,
        )
        self.lag = Gauge(
            f"{prefix}_replication_lag_bytes",
            "server WAL end minus confirmed LSN",
            registry=registry,
        )
        self.backpressure = Counter(
            f"{prefix}_backpressure_waits",
            "times reading paused because the memory guard was full",
            registry=registry,
        )
        self.snapshot_rows = Gauge(
            f"{prefix}_snapshot_rows",
            "rows of the running snapshot read and acknowledged, per table",
            ["table"],
            registry=registry,
        )
        self.snapshot_rows_estimate = Gauge(
            f"{prefix}_snapshot_rows_estimate",
            "rows the running snapshot expects per table (the planner's estimate)",
            ["table"],
            registry=registry,
        )
        self.snapshot_chunks_left = Gauge(
            f"{prefix}_snapshot_chunks_left",
            "chunks of the running snapshot not yet read and acknowledged, per table",
            ["table"],
            registry=registry,
        )
        self.snapshot_rate = Gauge(
            f"{prefix}_snapshot_rows_per_second",
            "rows per second the running snapshot reads (since it started or resumed)",
            registry=registry,
        )
        self.batch = Histogram(
            f"{prefix}_batch_messages",
            "replication messages handled per loop batch",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2000),
            registry=registry,
        )
        self.commit_to_ack = Histogram(
            f"{prefix}_commit_to_ack_seconds",
            "Postgres commit time to Kafka acknowledgement of the whole transaction",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
