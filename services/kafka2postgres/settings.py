"""kafka2postgres's settings: env prefix ``KAFKA2POSTGRES_``, optional YAML file; the
reference in docs/kafka2postgres.md is generated from this model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from shared.retry import BackoffPolicy
from shared.settings import (
    BatchSettings,
    ConsumerSettings,
    HttpSettings,
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    Section,
    ServiceSettings,
    VerifySettings,
    check_table_template,
)


class Kafka2PostgresConsumer(ConsumerSettings):
    group_id: str = Field(default="walcast-kafka2postgres", min_length=1)
    """The consumer group the instances share (partitions are divided among them)."""


class TargetPostgres(PostgresSettings):
    """The target database: where the tables are written."""

    database: str = "postgres"
    """The database the tables are written into."""
    user: str = "postgres"
    """The role kafka2postgres writes as (its privileges:
    [kafka2postgres.md](kafka2postgres.md#privileges))."""
    application_name: str = "walcast-kafka2postgres"
    """The name its sessions show in `pg_stat_activity`."""


class TargetSettings(Section):
    """Where and how the source's tables are written (docs/kafka2postgres.md)."""

    postgres: TargetPostgres = TargetPostgres()
    """The target database."""
    schema_template: str = "{schema}"
    """The target schema of a source table (`{db}`, `{schema}`, `{table}`); created when
    missing."""
    table_template: str = "{table}"
    """The target table's name (`{db}`, `{schema}`, `{table}`)."""
    on_drop_table: Literal["apply", "ignore"] = "ignore"
    """A source `DROP TABLE`: drop the target table too (only one walcast created), or
    keep it as it was."""
    adopt_tables: bool = False
    """Write into a target table that exists and that walcast did not create (its columns
    and key must be the source's; walcast never alters or drops it). Off: such a table
    stops with a message, untouched."""
    on_table_error: Literal["stop_table", "stop_service"] = "stop_table"
    """A permanent error of one table (a constraint or column type the source does not
    have, a type missing in the target): stop that table only — its records go to the
    dead-letter topic with the reason until `resume` — or stop the service."""
    fillfactor: int = Field(default=90, ge=10, le=100)
    """The fillfactor of the tables kafka2postgres creates (not of adopted ones): the room
    each page keeps for updated rows, so that an update that changes no indexed column
    stays on its page (a HOT update: no new index entry, fewer pages written). 100 is
    Postgres' default (pages filled, every update of a loaded table moves the row).
    Measured: TPC-B on 10M rows, docs/benchmarks.md."""
    tombstone_retention_s: float = Field(default=7 * 86400.0, ge=60)
    """How long a deleted row's version is remembered after the delete, so that an older
    change of the row, redelivered or replayed, cannot bring it back (a truncate or a
    snapshot's end forgets the versions below it at once). A replay from further back
    than this may resurrect rows deleted since."""

    @field_validator("schema_template")
    @classmethod
    def _schema(cls, v: str) -> str:
        try:
            name = v.format(db="d", schema="s", table="t")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"unknown field in {v!r}: {exc}; use {{db}} {{schema}} {{table}}"
            ) from exc
        if not name:
            raise ValueError("the schema template makes an empty name")
        return v

    @field_validator("table_template")
    @classmethod
    def _table(cls, v: str) -> str:
        return check_table_template(v, "a target table")


class Kafka2PostgresHttpSettings(HttpSettings):
    port: int = Field(default=9191, ge=0, le=65535)
    """The port to listen on (0: any free port, logged at start)."""


class Kafka2PostgresRetry(BackoffPolicy):
    give_up_after_s: float = Field(default=0.0, ge=0.0)
    """Seconds of failing attempts before giving up; 0 (the default here): never — the
    consumer waits out a target outage with its partitions paused."""


class Kafka2PostgresBatch(BatchSettings):
    max_docs: int = Field(default=20_000, ge=1)
    """Records in one write at most (one target transaction)."""
    max_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    """Bytes of records in one write at most."""
    concurrency: int = Field(default=2, ge=1, le=8)
    """Writes in flight at once: the next batch is read and reduced while one is written;
    the writes themselves commit one after another, in order."""


class Kafka2PostgresSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KAFKA2POSTGRES_")

    kafka: KafkaSettings = KafkaSettings()
    consumer: Kafka2PostgresConsumer = Kafka2PostgresConsumer()
    batch: Kafka2PostgresBatch = Kafka2PostgresBatch()
    target: TargetSettings = TargetSettings()
    http: Kafka2PostgresHttpSettings = Kafka2PostgresHttpSettings()
    retry: Kafka2PostgresRetry = Kafka2PostgresRetry()
    # walcast's events in Avro (the Confluent wire format): where their schemas are.
    schema_registry: SchemaRegistrySettings = SchemaRegistrySettings()
    # `kafka2postgres verify` / `repair`: the target's tables compared with the source's.
    verify: VerifySettings = VerifySettings()
