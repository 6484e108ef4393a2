"""kafka2spark's settings: env prefix ``KAFKA2SPARK_``, optional YAML file (see README)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from shared.contract.debezium_input import InputFormat
from shared.settings import (
    HttpSettings,
    KafkaSettings,
    SchemaRegistrySettings,
    Section,
    ServiceSettings,
    check_table_template,
)


class SourceSettings(Section):
    """The CDC topic(s), read with Spark's own Kafka source."""

    topics: list[str] = Field(default_factory=lambda: ["walcast.cdc"], min_length=1)
    # What the topics hold: walcast's change events, Debezium records (the PostgreSQL
    # connector's, JSON converter with schemas), or either, told apart record by record
    # (shared.contract.debezium_input).
    input_format: InputFormat = "walcast"
    # Where a query without a checkpoint starts.
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # Records per micro-batch at most (Spark's maxOffsetsPerTrigger); bounds batch memory.
    max_offsets_per_trigger: int = Field(default=200_000, ge=1)
    # Records per Spark task at most: a batch is read in at least
    # ceil(max_offsets_per_trigger / records_per_task) tasks (the Kafka source's
    # minPartitions), so no task, and no cached block of the batch, holds more. One
    # 500,000-record block made a 1 GB driver heap run out (the JVM exits on that).
    records_per_task: int = Field(default=100_000, ge=1_000)

    def min_partitions(self) -> int:
        return -(-self.max_offsets_per_trigger // self.records_per_task)

    # After each batch its offsets are also committed to this consumer group, so the lag
    # shows in standard Kafka tooling. The checkpoint, not the group, is where the job
    # resumes from.
    group_id: str = Field(default="walcast-kafka2spark", min_length=1)


class DeltaSettings(Section):
    """Where the tables live: one mirror per source table, the changelog, the quarantine."""

    root: Path = Path("delta")
    # Mirror table directory under ``root``, per source table.
    table_template: str = "{schema}.{table}"
    changelog_table: str = "_changelog"
    quarantine_table: str = "_quarantine"
    # The query's checkpoint (offsets, batch ids); default ``<root>/_checkpoints/mirror``.
    checkpoint: Path | None = None
    # ``maintain``: files older than this and no longer referenced are vacuumed.
    # At least a day: a shorter window could remove files a running MERGE just wrote.
    vacuum_retention_hours: int = Field(default=168, ge=24)

    @field_validator("table_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_table_template(v, "a path")

    def checkpoint_path(self) -> Path:
        return self.checkpoint or self.root / "_checkpoints" / "mirror"


class TriggerSettings(Section):
    # processing_time: a batch every ``interval_s``; available_now: everything in the
    # topic at start, then stop (a catch-up run, e.g. from cron).
    mode: Literal["processing_time", "available_now"] = "processing_time"
    interval_s: float = Field(default=5.0, gt=0)


_CONF_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


class SparkSettings(Section):
    """The Spark session. Local mode by default; any master (``spark://``, ``k8s://``)
    for more than one machine."""

    master: str = "local[2]"
    app_name: str = "walcast-kafka2spark"
    shuffle_partitions: int = Field(default=2, ge=1)
    # The Kafka source and Delta jars, comma-separated local paths (the local stack
    # resolves them from Maven Central into its env file), or empty to let
    # ``packages`` fetch them.
    jars: str = ""
    packages: str = ""
    ui: bool = False
    # Passed to the session as is (spark.* keys), after walcast's own.
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("conf")
    @classmethod
    def _conf(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _CONF_KEY.match(k)]
        if bad:
            raise ValueError(f"not Spark configuration keys: {bad}")
        return v


class Kafka2SparkHttpSettings(HttpSettings):
    # A section given in the environment or YAML is built from the class defaults, so
    # the service's own defaults live on subclasses, not on default instances.
    port: int = Field(default=9189, ge=0, le=65535)


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
