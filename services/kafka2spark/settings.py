"""kafka2spark's settings: env prefix ``KAFKA2SPARK_``, optional YAML file; the reference in
docs/kafka2spark.md is generated from this model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from shared.formats.debezium_input import InputFormat
from shared.settings import (
    HttpSettings,
    KafkaSettings,
    SchemaRegistrySettings,
    Section,
    ServiceSettings,
    VerifySettings,
    check_table_template,
)


class SourceSettings(Section):
    """The CDC topic(s), read with Spark's own Kafka source."""

    topics: list[str] = Field(default_factory=lambda: ["walcast.cdc"], min_length=1)
    """The CDC topics to read (a JSON list in env vars)."""
    input_format: InputFormat = "walcast"
    """What the topics hold, as kafka2search's `consumer.input_format`: walcast's change
    events (`walcast`), Debezium records (`debezium`: the PostgreSQL connector's, JSON
    converter with schemas), or either, told apart record by record (`auto`). With
    `schema_registry.url` set, Avro records (the Confluent wire format) are decoded first;
    unreadable records go to the quarantine."""
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    """Where a query without a checkpoint starts: `earliest`, the oldest records the topics
    hold; `latest`, only records written after the start. A checkpoint, once there, is
    where the job resumes."""
    max_offsets_per_trigger: int = Field(default=200_000, ge=1)
    """Records per micro-batch at most (Spark's `maxOffsetsPerTrigger`): bounds a batch's
    memory, and so the wait of a change that arrives while one runs."""
    # One 500,000-record block made a 1 GB driver heap run out (the JVM exits on that).
    records_per_task: int = Field(default=100_000, ge=1_000)
    """Records per Spark task at most, at least 1000: a batch is read in at least
    `max_offsets_per_trigger` / `records_per_task` tasks, rounded up (the Kafka source's
    `minPartitions`), which bounds the memory of one task and of one cached block of the
    batch."""

    def min_partitions(self) -> int:
        return -(-self.max_offsets_per_trigger // self.records_per_task)

    group_id: str = Field(default="walcast-kafka2spark", min_length=1)
    """The consumer group each batch's offsets are committed to once it is written, so the
    lag shows in standard Kafka tooling. The job resumes from its checkpoint, never from
    the group."""


class DeltaSettings(Section):
    """Where the tables live: one mirror per source table, the changelog, the quarantine."""

    root: Path = Path("delta")
    """The directory the tables live in, with the default checkpoint and walcast's lists of
    mirrors and held tables (the local stack sets `.stack/delta`)."""
    table_template: str = "{schema}.{table}"
    """A mirror's directory under `root`, per source table: a template over `{db}`,
    `{schema}` and `{table}` (`{table}` required). A name that is not plain `[a-z0-9_]`
    gets a sanitised name with a hash suffix, so no two tables share a mirror."""
    changelog_table: str = "_changelog"
    """The changelog's directory under `root`: every change event, partitioned by source
    table and commit date."""
    quarantine_table: str = "_quarantine"
    """The quarantine's directory under `root`: the records that are not change events or
    cannot be applied, with the reason and their topic, partition and offset."""
    checkpoint: Path | None = None
    """The query's checkpoint (offsets, batch ids), where the job resumes from; unset:
    `<root>/_checkpoints/mirror`."""
    # At least a day: a shorter window could remove files a running MERGE just wrote.
    vacuum_retention_hours: int = Field(default=168, ge=24)
    """`maintain` vacuums the files no longer referenced and older than this many hours (at
    least 24, so files a running MERGE just wrote are never removed)."""

    @field_validator("table_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_table_template(v, "a path")

    def checkpoint_path(self) -> Path:
        return self.checkpoint or self.root / "_checkpoints" / "mirror"


class TriggerSettings(Section):
    """When micro-batches run."""

    mode: Literal["processing_time", "available_now"] = "processing_time"
    """`processing_time`: a micro-batch every `interval_s` until stopped; `available_now`:
    everything the topics hold at start, then the job ends (a catch-up run, e.g. from
    cron)."""
    interval_s: float = Field(default=5.0, gt=0)
    """Seconds between micro-batches (`processing_time` mode)."""
    stop_grace_s: float = Field(default=90.0, ge=0)
    """On SIGTERM, seconds the micro-batch in hand may take to finish (written and
    committed to the checkpoint) before the query stops; a backlog behind it is not waited
    for. The chart gives the pod this plus `kafka2spark.shutdownMarginSeconds`. Past them,
    or with 0, the batch is interrupted: nothing is lost (a Delta commit is atomic; the
    batch runs again from the checkpoint after the restart), but its work is done twice."""


_CONF_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


class SparkSettings(Section):
    """The Spark session. Local mode by default; any master (``spark://``, ``k8s://``)
    for more than one machine."""

    master: str = "local[2]"
    """The Spark master: `local[2]` is local mode with two threads (the driver on
    127.0.0.1); any other master (`spark://…`, `k8s://…`) runs the job on a cluster."""
    app_name: str = "walcast-kafka2spark"
    """The Spark application's name."""
    shuffle_partitions: int = Field(default=2, ge=1)
    """Partitions of Spark's shuffles (`spark.sql.shuffle.partitions`, also the partitions
    Delta reads its log with): few, for one machine."""
    jars: str = ""
    """The Kafka source and Delta jars, comma-separated local paths (the local stack
    resolves them from Maven Central into its env file, so the job starts offline); empty
    to let `packages` fetch them."""
    packages: str = ""
    """The Kafka source and Delta jars as comma-separated Maven coordinates, fetched at
    start (`spark.jars.packages`); empty: nothing fetched."""
    ui: bool = False
    """Serve the Spark UI."""
    interpret_below: int = Field(default=20_000, ge=0)
    """A micro-batch of fewer records than this runs its plans interpreted instead of
    compiled (`spark.sql.codegen.wholeStage=false` and
    `spark.sql.codegen.factoryMode=NO_CODEGEN` for that batch): Spark compiles every plan
    of a batch (a MERGE per table and segment, each with its own literals) to bytecode,
    seconds of CPU repaid only by many rows. Measured: a 4,884-record batch over four
    tables 76 s compiled, 55 s interpreted; 200,000 records 51 s compiled, 62 s
    interpreted. 0: always compiled. Settings of these keys in `conf` win."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Any Spark settings (`spark.*` keys, e.g. `spark.driver.memory`), passed to the
    session as they are after walcast's own, so they take precedence."""

    @field_validator("conf")
    @classmethod
    def _conf(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _CONF_KEY.match(k)]
        if bad:
            raise ValueError(f"not Spark configuration keys: {bad}")
        return v


class Kafka2SparkHttpSettings(HttpSettings):
    """The /metrics, /health and /ready endpoint of a service."""

    # A section given in the environment or YAML is built from the class defaults, so
    # the service's own defaults live on subclasses, not on default instances.
    port: int = Field(default=9189, ge=0, le=65535)
    """The port to listen on (0: any free port, logged at start)."""


class Kafka2SparkSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KAFKA2SPARK_")

    kafka: KafkaSettings = KafkaSettings()
    source: SourceSettings = SourceSettings()
    delta: DeltaSettings = DeltaSettings()
    trigger: TriggerSettings = TriggerSettings()
    spark: SparkSettings = SparkSettings()
    http: Kafka2SparkHttpSettings = Kafka2SparkHttpSettings()
    # walcast's events in Avro (the Confluent wire format): where their schemas are.
    schema_registry: SchemaRegistrySettings = SchemaRegistrySettings()
    # `kafka2spark verify`: the mirrors compared with their Postgres tables.
    verify: VerifySettings = VerifySettings()
