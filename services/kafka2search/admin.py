"""kafka2search's operator commands: ``status`` and ``replay``."""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import datetime
from typing import Any

from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry

from services.kafka2search.app import consumer_loop
from services.kafka2search.engines import SearchEngine, engine_for
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.verify import last_outcomes
from shared.errors import ConfigError, PermanentError
from shared.kafka import oldest_timestamp_s, replay_range
from shared.retry import call_with_retry
from shared.sink_status import group_status

log = logging.getLogger(__name__)


def alias_pattern(template: str) -> str:
    """The aliases the template can produce, as an engine wildcard pattern."""
    return template.format(db="*", schema="*", table="*").lower()


def _count(engine: SearchEngine, alias: str) -> int | None:
    """Documents in the index; None while a just-created index has no active shard."""
    try:
        return engine.count(alias)
    except Exception as exc:
        if getattr(exc, "status_code", None) == 503:
            return None
        raise


def status(settings: Kafka2SearchSettings) -> dict[str, Any]:
    """Consumer lag per partition, documents per index, dead letters."""
    head = group_status(settings.kafka, settings.consumer, settings.retry)
    engine = engine_for(settings.engine)
    try:
        aliases = engine.aliases(alias_pattern(settings.index.name_template))
        indices = [
            {"alias": a, "index": i, "documents": _count(engine, a)}
            for a, i in sorted(aliases.items())
        ]
        verified = last_outcomes(engine, settings.consumer.group_id)
    finally:
        engine.close()
    return {
        **head,
        "engine": settings.engine.kind,
        "indices": indices,
        # each table's last verification by the continuous mode (verify.interval_s)
        "verify": verified,
    }


def replay(
    settings: Kafka2SearchSettings,
    *,
    from_offset: int | None = None,
    from_timestamp: datetime | None = None,
    partitions: list[int] | None = None,
    allow_deleted_to_return: bool = False,
) -> int:
    """Read the topics again from an offset or a time up to their current end, into the
    same indices. Safe while the service runs: writes are versioned by LSN, so nothing
    newer is overwritten; the group's committed offsets are not touched. Returns the
    number of records read."""
    if (from_offset is None) == (from_timestamp is None):
        raise ConfigError("give exactly one of --from-offset and --from-timestamp")
    start, until = call_with_retry(
        lambda: replay_range(
            settings.kafka.client_config(),
            settings.consumer.topics,
            from_offset,
            from_timestamp,
            partitions,
        ),
        policy=settings.retry,
        what="find the replay's offsets",
    )
    if not allow_deleted_to_return:
        _check_delete_memory(settings, start, until)
    # Only partitions with something to read: an empty one would never report a position.
    start = [tp for tp in start if tp.offset < until[(tp.topic, tp.partition)]]
    until = {(tp.topic, tp.partition): until[(tp.topic, tp.partition)] for tp in start}
    total = sum(until[(tp.topic, tp.partition)] - tp.offset for tp in start)
    log.info("replay: %d records from %d partitions", total, len(start))
    if not start:
        return 0
    engine = engine_for(settings.engine)
    loop, _indexer = consumer_loop(
        settings,
        engine,
        CollectorRegistry(),
        threading.Event(),
        group_id=f"{settings.consumer.group_id}-replay",
        start=lambda consumer, _parts: consumer.assign(start),
        until=until,
    )
    try:
        loop.run()  # a transient failure reads again from the start: writes are versioned
    finally:
        engine.close()
    return total


_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(value: str) -> float:
    """An engine time value (``1h``, ``30m``, ``500ms``) in seconds."""
    m = _DURATION.match(value.strip())
    if m is None:
        raise ConfigError(f"not a time value: {value!r}", hint="e.g. 1h, 30m, 60s")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def _check_delete_memory(
    settings: Kafka2SearchSettings,
    start: list[TopicPartition],
    until: dict[tuple[str, int], int],
) -> None:
    """Refuse a replay that could bring deleted documents back. The engine refuses an
    older write to a deleted document only while it remembers the delete
    (``index.gc_deletes``); a replay from records older than that would re-insert rows
    deleted since. Reads the timestamp of each partition's first record to replay."""
    memory = duration_s(settings.index.gc_deletes)
    oldest = oldest_timestamp_s(settings.kafka.client_config(), start, until)
    if oldest is None:
        return
    age = time.time() - oldest
    if age > memory:
        raise PermanentError(
            f"the replay would start at records {age / 3600:.1f} h old, older than"
            f" index.gc_deletes ({settings.index.gc_deletes}): rows deleted since then"
            " would come back",
            hint="replay into emptied indices (delete them first; the replay recreates"
            " them), replay from a later offset or time, or pass --allow-deleted-to-return",
        )
