"""kafka2spark: a Spark Structured Streaming query mirroring CDC topic(s) into Delta Lake.

Spark's own Kafka source reads the topic(s); the query's checkpoint holds the offsets
(the job resumes from it, not from the consumer group). Each micro-batch is handed to
:class:`~services.kafka2spark.mirror.DeltaMirror` (``foreachBatch``); when it has
written everything, the batch's offsets are committed to ``source.group_id`` too, so lag
shows in standard Kafka tooling, and the metrics are updated. A batch that fails stops the
query; on restart Spark runs it again from the checkpoint, and the mirror's writes are
idempotent (see mirror.py).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from services.kafka2spark.checkpoint import clear_unstarted
from services.kafka2spark.mirror import BatchResult, DeltaMirror
from services.kafka2spark.names import WRITER
from services.kafka2spark.settings import Kafka2SparkSettings
from shared.errors import NoAnswerError, PermanentError
from shared.failpoints import failpoint
from shared.kafka import KafkaOffsetCheckpointer, close_consumer
from shared.retry import call_with_retry
from shared.secrets import SENSITIVE_KEY_PATTERN
from shared.service import Runner
from shared.settings import KafkaSettings
from shared.verify.continuous import Continuous, VerifyMetrics

log = logging.getLogger(__name__)

# Spark's default is (?i)secret|password|token|access[.]?key; spark.conf may override it.
SPARK_REDACTION_REGEX = f"(?i){SENSITIVE_KEY_PATTERN}"

DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


class Metrics:
    def __init__(self, registry: CollectorRegistry, prefix: str = "walcast_kafka2spark") -> None:
        self.batches = Counter(f"{prefix}_batches", "micro-batches written", registry=registry)
        self.phase_seconds = Histogram(
            f"{prefix}_batch_phase_seconds",
            "time per part of a micro-batch: read, quarantine, changelog, plan, table (its"
            " merges and DDL, each table one observation), commit",
            ["phase"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=registry,
        )
        self.batch_seconds = Histogram(
            f"{prefix}_batch_seconds",
            "micro-batch duration (parse, changelog, merges, commit)",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=registry,
        )
        self.records = Counter(f"{prefix}_records", "Kafka records read", registry=registry)
        self.merged = Counter(
            f"{prefix}_rows_merged", "changes merged into mirrors (after reduction per key)",
            ["table"], registry=registry,
        )  # fmt: skip
        self.keyless = Counter(
            f"{prefix}_keyless_changes",
            "changes without key values, not merged into a mirror (the table had no key)",
            ["table"], registry=registry,
        )  # fmt: skip
        self.beyond = Counter(
            f"{prefix}_dates_out_of_range",
            "date / timestamp values outside years 1..9999 stored as NULL (exact in the"
            " changelog)",
            ["table"], registry=registry,
        )  # fmt: skip
        self.topic_reset = Counter(
            f"{prefix}_topic_resets",
            "times the query stopped because the topic's offsets went back (re-created)",
            registry=registry,
        )
        self.held = Gauge(
            f"{prefix}_held_tables",
            "tables whose mirror failed: their changes go to the quarantine until released",
            registry=registry,
        )
        self.quarantined = Counter(
            f"{prefix}_quarantined", "records sent to the quarantine table", registry=registry
        )
        self.schema_changes = Counter(
            f"{prefix}_schema_changes", "truncates and DDL applied to mirrors", registry=registry
        )
        self.lag = Gauge(
            f"{prefix}_lag_records", "end offset minus the last batch's position",
            ["topic", "partition"], registry=registry,
        )  # fmt: skip
        self.record_age = Histogram(
            f"{prefix}_record_age_seconds",
            "Kafka to Delta: age of a batch's oldest record (its Kafka timestamp) when the"
            " batch was committed",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
            registry=registry,
        )
        self.last_batch = Gauge(f"{prefix}_last_batch_id", "last batch written", registry=registry)
        self.last_batch_time = Gauge(
            f"{prefix}_last_batch_timestamp_seconds", "when the last batch ended", registry=registry
        )


def kafka_source_options(k: KafkaSettings) -> dict[str, str]:
    """The Kafka settings as options of Spark's Kafka source (Java client names)."""
    opts = {
        "kafka.bootstrap.servers": k.bootstrap_servers,
        "kafka.client.id": k.client_id,
        "kafka.security.protocol": k.security_protocol,
    }
    if k.sasl_mechanism:
        opts["kafka.sasl.mechanism"] = k.sasl_mechanism
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if k.sasl_mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        password = k.sasl_password.get_secret_value() if k.sasl_password else ""
        opts["kafka.sasl.jaas.config"] = (
            f'{module} required username="{_jaas(k.sasl_username or "")}"'
            f' password="{_jaas(password)}";'
        )
    if k.ssl_ca_location is not None:
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = str(k.ssl_ca_location)
    return opts


def _jaas(value: str) -> str:
    """A JAAS option value inside double quotes (Kafka parses them with backslash escapes)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def spark_session(s: Kafka2SparkSettings) -> SparkSession:
    """The session: Delta's catalog and extensions, small shuffles for one machine, UTC
    (timestamps in the mirror are the Postgres instants), Spark's redaction of secrets
    widened to walcast's (:mod:`shared.secrets`), then the user's overrides."""
    sp = s.spark
    builder = (
        SparkSession.builder.master(sp.master)
        .appName(sp.app_name)
        .config("spark.ui.enabled", str(sp.ui).lower())
        # No console progress bars ([Stage 0:>  (0 + 2) / 6]) between the JSON log lines.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(sp.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        # Parquet timestamps as int64 microseconds, not Spark's default INT96: readers
        # such as delta-rs read INT96 as nanoseconds, which overflow outside 1677..2262
        # (a 0001-01-01 or 9999-12-31 made the whole table unreadable to them).
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        # Small tables: Delta's default of 50 partitions to read its log costs seconds.
        .config("spark.databricks.delta.snapshotPartitions", str(max(sp.shuffle_partitions, 1)))
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        # Spark masks configuration and source options whose key or value matches this in
        # its own logs, plans and UI: the keys walcast itself treats as secrets.
        .config("spark.redaction.regex", SPARK_REDACTION_REGEX)
    )
    if sp.master.startswith("local"):
        # One machine: the driver listens on loopback only.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
        # Python workers (the Debezium input's translation runs in them) use this
        # interpreter, which has walcast's dependencies; PySpark's default is `python3`.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if sp.jars:
        builder = builder.config("spark.jars", sp.jars)
    if sp.packages:
        builder = builder.config("spark.jars.packages", sp.packages)
    for key, value in sp.conf.items():
        builder = builder.config(key, value)
    # Every Delta commit of this session says it is kafka2spark's (after the overrides:
    # verify tells another writer's commits by it, services/kafka2spark/provenance.py).
    builder = builder.config("spark.databricks.delta.commitInfo.userMetadata", WRITER)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


class GroupCommitter:
    """Commits each batch's offsets to the consumer group and measures the lag. Not the
    job's checkpoint (Spark's is): a failure here fails the batch, which is run again."""

    def __init__(self, settings: Kafka2SparkSettings, metrics: Metrics) -> None:
        self.metrics = metrics
        self.config = {
            **settings.kafka.client_config(),
            "group.id": settings.source.group_id,
            "enable.auto.commit": False,
        }
        self.consumer = Consumer(self.config)
        self.checkpointer = KafkaOffsetCheckpointer(self.consumer)
        self.retry = settings.retry

    def _commit(self, offsets: dict[tuple[str, int], int]) -> None:
        try:
            self.checkpointer.commit(offsets)
        except NoAnswerError:
            # This client may never reach the coordinator again: the retry uses a new one.
            old, stuck = self.consumer, self.checkpointer.stuck
            close_consumer(old, timeout_s=self.checkpointer.timeout_s, stuck=stuck)
            self.consumer = Consumer(self.config)
            self.checkpointer = KafkaOffsetCheckpointer(self.consumer)
            raise

    def __call__(self, result: BatchResult) -> None:
        if not result.offsets:
            return
        # Transient broker errors (a coordinator loading or moving) are waited out here:
        # failing the batch would redo all of its Delta work.
        call_with_retry(
            lambda: self._commit(result.offsets),
            policy=self.retry,
            what="commit the batch's offsets to the group",
        )
        try:
            for (topic, partition), offset in result.offsets.items():
                _low, high = self.consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=5
                )
                self.metrics.lag.labels(topic, str(partition)).set(max(0, high - offset - 1))
        except KafkaException as exc:
            log.debug("lag not updated: %s", exc)

    def close(self) -> None:
        """Leaves the group and lets the client go. This object outlives the query: py4j's
        pool of Python callbacks keeps the batch function (and so this committer) as long
        as the JVM runs, and a client, even closed, holds one of the process's 1,024
        thread-local keys until it is freed. Not called again; no commit after it."""
        cp = self.checkpointer
        close_consumer(self.consumer, timeout_s=cp.timeout_s, stuck=cp.stuck)
        del self.consumer, self.checkpointer


@dataclass
class Service:
    settings: Kafka2SparkSettings
    spark: SparkSession
    mirror: DeltaMirror
    metrics: Metrics
    committer: GroupCommitter
    runner: Runner
    query: StreamingQuery | None = None
    batches: int = 0  # finished since start (readiness)
    verifier: Continuous | None = None  # verify.interval_s

    @property
    def registry(self) -> CollectorRegistry:
        return self.runner.registry

    def start(self) -> StreamingQuery:
        s = self.settings
        reader = self.spark.readStream.format("kafka")
        for key, value in kafka_source_options(s.kafka).items():
            reader = reader.option(key, value)
        stream = (
            reader.option("subscribe", ",".join(s.source.topics))
            .option("startingOffsets", s.source.starting_offsets)
            .option("maxOffsetsPerTrigger", s.source.max_offsets_per_trigger)
            .option("minPartitions", s.source.min_partitions())
            .load()
        )
        clear_unstarted(s.delta.checkpoint_path())
        writer = (
            stream.writeStream.foreachBatch(self.mirror)
            .queryName("walcast_mirror")
            .option("checkpointLocation", str(s.delta.checkpoint_path()))
        )
        if s.trigger.mode == "available_now":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{s.trigger.interval_s} seconds")
        self.query = writer.start()
        log.info(
            "mirroring %s into %s (checkpoint %s)",
            ", ".join(s.source.topics), s.delta.root, s.delta.checkpoint_path(),
        )  # fmt: skip
        return self.query

    def run(self) -> None:
        """Run until stopped (or, with ``trigger.mode = available_now``, caught up)."""
        if self.verifier is not None:
            self.verifier.start()
        self.runner.run(self._mirror, cleanup=self.committer.close)

    def _mirror(self) -> None:
        query = self.start()
        while query.isActive and not self.runner.stop_event.is_set():
            try:
                query.awaitTermination(1)
            except Exception:  # noqa: BLE001 - the failure is read below
                break
        if query.isActive:
            commits = self.settings.delta.checkpoint_path() / "commits"
            finish_batch_in_hand(
                self.mirror.batch_id,
                lambda batch: (commits / str(batch)).exists(),
                lambda: query.isActive,
                self.settings.trigger.stop_grace_s,
            )
            query.stop()
            if query.exception() is not None:
                # Asked to stop: a batch Spark had begun after the one in hand (or one past
                # the grace) was interrupted, or the query failed meanwhile. Nothing of
                # that batch was committed; it runs again after the restart.
                log.warning(
                    "the query ended while stopping: %s", _first_line(str(query.exception()))
                )
                return
        failure = query.exception()
        if failure is not None:
            text = str(failure)
            if any(marker in text for marker in _TOPIC_RECREATED):
                self.metrics.topic_reset.inc()
                raise PermanentError(
                    "the CDC topic's offsets went back (the topic was deleted and created"
                    f" again, or records expired unread): {_first_line(text)}",
                    hint="the mirrors hold what was read before; to start over from the new"
                    " topic, move delta.checkpoint aside and empty the mirrors (a new"
                    " checkpoint re-reads everything: the changelog would hold it twice), or"
                    " re-snapshot the tables",
                )
            raise RuntimeError(f"the mirror query failed: {failure}")

    def stop(self, *_: object) -> None:
        self.runner.stop()

    def install_signal_handlers(self) -> None:
        self.runner.install_signal_handlers("the query")


def finish_batch_in_hand(
    in_hand: int | None,
    committed: Callable[[int], bool],
    active: Callable[[], bool],
    grace_s: float,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> bool:
    """Before a stop: wait up to ``grace_s``, while the query is ``active``, until the
    micro-batch in hand (``in_hand``: the last one handed to the mirror) is ``committed``
    to Spark's checkpoint (``commits/<id>``, written after the batch) — stopping the
    query interrupts its Delta commit (Delta then overflows its stack unwinding, a log
    full of errors) and the batch runs again after the restart. Only that batch: one
    Spark starts meanwhile is stopped early in its life, before it writes. True when it
    was committed (or there was none)."""
    if in_hand is None or committed(in_hand):
        return True
    log.info("finishing micro-batch %d before stopping (at most %.0f s)", in_hand, grace_s)
    deadline = clock() + grace_s
    while not committed(in_hand) and active() and clock() < deadline:
        pause(0.2)
    if committed(in_hand):
        return True
    if active():
        log.warning(
            "micro-batch %d did not finish within trigger.stop_grace_s=%.0f: it is"
            " interrupted, and runs again from the checkpoint after the restart",
            in_hand,
            grace_s,
        )
    return False


# Spark's Kafka source, with failOnDataLoss (the default), when offsets went backwards.
_TOPIC_RECREATED = (
    "failOnDataLoss",
    "were deleted",
    "offset was changed from",
    "Cannot fetch offset",
)


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:500]


def build(settings: Kafka2SparkSettings, spark: SparkSession | None = None) -> Service:
    """Wire the job: Spark session, mirror, group commits, metrics, ops endpoint."""
    runner = Runner(settings.http)
    metrics = Metrics(runner.registry)
    committer = GroupCommitter(settings, metrics)
    session = spark or spark_session(settings)

    def on_batch(result: BatchResult) -> None:
        failpoint("kafka2spark.batch_written")  # Delta written; no offset, no checkpoint
        with result.phase("commit"):
            committer(result)
        service.batches += 1
        metrics.batches.inc()
        metrics.batch_seconds.observe(result.seconds)
        if result.first_ts is not None:
            metrics.record_age.observe(max(0.0, time.time() - result.first_ts))
        metrics.records.inc(result.records)
        metrics.quarantined.inc(result.quarantined)
        metrics.schema_changes.inc(len(result.schema_changes))
        for table, n in result.merged.items():
            metrics.merged.labels(table).inc(n)
        for table, n in result.keyless.items():
            metrics.keyless.labels(table).inc(n)
        for table, n in result.beyond.items():
            metrics.beyond.labels(table).inc(n)
        metrics.held.set(len(mirror.held()))
        metrics.last_batch.set(result.batch_id)
        metrics.last_batch_time.set(time.time())
        for phase, seconds in result.phases.items():
            metrics.phase_seconds.labels(phase.split(" ")[0]).observe(seconds)
        log.info(
            "batch %d: %d records, %d quarantined, merged %s%s in %.1fs (%s)",
            result.batch_id, result.records, result.quarantined, result.merged or "nothing",
            "; " + "; ".join(result.schema_changes) if result.schema_changes else "",
            result.seconds, result.breakdown(),
        )  # fmt: skip

    mirror = DeltaMirror(session, settings, on_batch)
    service = Service(settings, session, mirror, metrics, committer, runner)

    def active() -> tuple[bool, str]:
        """Ready = consuming: the query runs and has finished a batch since start, or has
        nothing to read (after a restart the first batch redoes the interrupted one, and
        the JVM and Delta's log take their time: not ready before that)."""
        q = service.query
        if q is None or not q.isActive:
            return False, "query not running"
        if service.batches:
            return True, f"{service.batches} batches since start"
        idle = not q.status.get("isDataAvailable", True)
        return idle, "caught up, waiting for data" if idle else "first batch running"

    def failed() -> tuple[bool, str]:
        q = service.query
        exc: Any = q.exception() if q is not None and not q.isActive else None
        return (exc is None, str(exc) if exc else "no failure")

    runner.health("query", failed)
    runner.ready("query", active)
    verify_metrics = VerifyMetrics(runner.registry)
    if settings.verify.interval_s:
        # pyarrow and numpy only when verifying (a plain run does without them)
        from services.kafka2spark.verify import continuous

        service.verifier = continuous(settings, verify_metrics, runner.stop_event)
    return service


__all__ = ["Service", "build", "kafka_source_options", "spark_session"]
