"""kafka2spark's operator commands: ``status`` and ``maintain``.

``status`` needs no Spark: the last batch comes from the query's checkpoint directory
(``commits/<batch id>``, written by Spark after each batch), the lag from the consumer
group the job commits to, table versions and row counts from the Delta logs through the
``deltalake`` reader.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from pyspark.sql import SparkSession

from services.kafka2spark.held import read_held
from services.kafka2spark.settings import Kafka2SparkSettings
from shared.kafka import group_lag
from shared.retry import call_with_retry

log = logging.getLogger(__name__)


def delta_tables(root: Path) -> list[Path]:
    """Every Delta table under ``root`` (mirrors, changelog, quarantine)."""
    if not root.is_dir():
        return []
    return sorted(
        p.parent for p in root.glob("*/_delta_log") if p.is_dir() and any(p.glob("*.json"))
    )


def last_batch(checkpoint: Path) -> dict[str, Any] | None:
    commits = checkpoint / "commits"
    ids = [int(p.name) for p in commits.glob("*") if p.name.isdigit()] if commits.is_dir() else []
    if not ids:
        return None
    last = max(ids)
    at = datetime.fromtimestamp((commits / str(last)).stat().st_mtime, tz=UTC)
    return {"batch_id": last, "committed_at": at.isoformat()}


def status(settings: Kafka2SparkSettings) -> dict[str, Any]:
    from deltalake import DeltaTable

    from services.kafka2spark.verify import last_outcomes

    consumer = Consumer({**settings.kafka.client_config(), "group.id": settings.source.group_id})
    try:
        # A brand-new broker answers NOT_COORDINATOR until its group coordinator loaded.
        lag = call_with_retry(
            lambda: group_lag(consumer, list(settings.source.topics)),
            policy=settings.retry,
            what="read the group's offsets",
        )
    finally:
        consumer.close()
    tables = []
    for path in delta_tables(settings.delta.root):
        dt = DeltaTable(str(path))
        tables.append(
            {
                "table": path.name,
                "path": str(path),
                "version": dt.version(),
                "rows": dt.to_pyarrow_dataset().count_rows(),
            }
        )
    return {
        "group": settings.source.group_id,
        "checkpoint": str(settings.delta.checkpoint_path()),
        "last_batch": last_batch(settings.delta.checkpoint_path()),
        "lag": lag,
        "total_lag": sum(p["lag"] for p in lag),
        "tables": tables,
        "held": read_held(settings.delta.root),
        # each table's last verification by the continuous mode (verify.interval_s)
        "verify": last_outcomes(settings),
    }


def maintain(
    settings: Kafka2SparkSettings, spark: SparkSession | None = None
) -> list[dict[str, Any]]:
    """Compact each table's small files, then vacuum files unreferenced for longer than
    ``delta.vacuum_retention_hours``. Safe while the job runs (Delta's optimistic
    concurrency: a conflicting commit retries or fails one side cleanly)."""
    from delta.tables import DeltaTable

    from services.kafka2spark.app import spark_session

    session = spark or spark_session(settings)
    hours = settings.delta.vacuum_retention_hours
    if hours < 168:
        # Delta refuses a retention under 7 days unless told: the operator set it.
        session.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    done = []
    try:
        for path in delta_tables(settings.delta.root):
            table = DeltaTable.forPath(session, str(path))
            metrics = table.optimize().executeCompaction().collect()[0]["metrics"]
            removed = table.vacuum(float(hours)).count()
            entry = {
                "table": path.name,
                "files_added": int(metrics["numFilesAdded"]),
                "files_removed": int(metrics["numFilesRemoved"]),
                "vacuumed": removed,
            }
            log.info("maintained %s: %s", path.name, entry)
            done.append(entry)
    finally:
        if spark is None:
            session.stop()
    return done
