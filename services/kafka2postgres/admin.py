"""kafka2postgres's operator commands: ``status``, ``replay`` and ``resume``."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry
from psycopg import sql

from services.kafka2postgres.app import consumer_loop
from services.kafka2postgres.applier import connect
from services.kafka2postgres.settings import Kafka2PostgresSettings
from services.kafka2postgres.statements import ROWS, TABLES
from shared.errors import ConfigError, PermanentError
from shared.kafka import oldest_timestamp_s, replay_range
from shared.migrations import migrate
from shared.retry import call_with_retry
from shared.sink_status import group_status

log = logging.getLogger(__name__)


def status(settings: Kafka2PostgresSettings) -> dict[str, Any]:
    """Consumer lag per partition, the target tables (rows, floor, stopped and why), dead
    letters."""
    head = group_status(settings.kafka, settings.consumer, settings.retry)
    with connect(settings) as conn:
        migrate(conn, "kafka2postgres")
        rows = conn.execute(
            sql.SQL(
                "SELECT t.source_schema, t.source_table, t.target_schema, t.target_table,"
                " t.created_by_walcast, t.floor, t.stopped, t.stopped_at,"
                " (SELECT count(*) FROM {rows} r WHERE r.tbl = t.id AND NOT r.deleted),"
                " (SELECT count(*) FROM {rows} r WHERE r.tbl = t.id AND r.deleted)"
                " FROM {tables} t ORDER BY 1, 2"
            ).format(rows=ROWS, tables=TABLES)
        ).fetchall()
    tables = [
        {"source": f"{r[0]}.{r[1]}", "target": f"{r[2]}.{r[3]}", "created_by_walcast": r[4],
         "floor": r[5], "stopped": r[6], "stopped_at": r[7].isoformat() if r[7] else None,
         "rows": r[8], "deleted_rows_remembered": r[9]}
        for r in rows
    ]  # fmt: skip
    return {**head, "tables": tables}


def resume(settings: Kafka2PostgresSettings, schema: str, table: str) -> bool:
    """Let a stopped table's changes be applied again (its records dead-lettered while it
    was stopped are not: re-snapshot the table). Returns whether it was stopped."""
    with connect(settings) as conn:
        migrate(conn, "kafka2postgres")
        row = conn.execute(
            sql.SQL(
                "UPDATE {} SET stopped = NULL, stopped_at = NULL WHERE source_schema = %s"
                " AND source_table = %s AND stopped IS NOT NULL RETURNING id"
            ).format(TABLES),
            [schema, table],
        ).fetchone()
    return row is not None


def replay(
    settings: Kafka2PostgresSettings,
    *,
    from_offset: int | None = None,
    from_timestamp: datetime | None = None,
    partitions: list[int] | None = None,
    allow_deleted_to_return: bool = False,
) -> int:
    """Read the topics again from an offset or a time up to their current end, into the
    same tables. Safe while the service runs: every write is versioned, so nothing newer
    is overwritten; the group's committed offsets are not touched. Returns the number of
    records read."""
    if (from_offset is None) == (from_timestamp is None):
        raise ConfigError("give exactly one of --from-offset and --from-timestamp")
    start, until = call_with_retry(
        lambda: replay_range(
            settings.kafka.client_config(), settings.consumer.topics, from_offset,
            from_timestamp, partitions,
        ),
        policy=settings.retry,
        what="find the replay's offsets",
    )  # fmt: skip
    if not allow_deleted_to_return:
        oldest = oldest_timestamp_s(settings.kafka.client_config(), start, until)
        memory = settings.target.tombstone_retention_s
        if oldest is not None and time.time() - oldest > memory:
            raise PermanentError(
                f"the replay would start at records {(time.time() - oldest) / 3600:.1f} h old,"
                f" older than target.tombstone_retention_s ({memory:g} s): rows deleted since"
                " then would come back",
                hint="replay from a later offset or time, or pass --allow-deleted-to-return",
            )
    start = [tp for tp in start if tp.offset < until[(tp.topic, tp.partition)]]
    until = {(tp.topic, tp.partition): until[(tp.topic, tp.partition)] for tp in start}
    total = sum(until[(tp.topic, tp.partition)] - tp.offset for tp in start)
    log.info("replay: %d records from %d partitions", total, len(start))
    if not start:
        return 0
    loop, applier = consumer_loop(
        settings, CollectorRegistry(), threading.Event(),
        group_id=f"{settings.consumer.group_id}-replay",
        start=lambda consumer, _parts: consumer.assign(start), until=until,
    )  # fmt: skip
    try:
        loop.run()  # a transient failure reads again from the start: writes are versioned
    finally:
        applier.close()
    return total
