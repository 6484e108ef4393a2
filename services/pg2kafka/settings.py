"""pg2kafka's settings: env prefix ``PG2KAFKA_``, optional YAML file (see README)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from services.pg2kafka.filters import split_pattern
from shared.settings import (
    HttpSettings,
    KafkaSettings,
    PostgresSettings,
    Section,
    ServiceSettings,
)

_SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")


class ReplicationSettings(Section):
    """The slot and publication pg2kafka streams from (created by ``pg2kafka init``)."""

    slot: str = "walcast"
    publication: str = "walcast"
    # Seconds between standby status updates; must stay well under the server's
    # wal_sender_timeout (60 s by default) or Postgres drops the connection.
    status_interval_s: float = Field(default=5.0, gt=0, le=30)
    # Seconds between heartbeat messages written into this database's WAL, so the slot
    # advances even when nothing published changes (idle or fully filtered). 0 = off.
    heartbeat_interval_s: float = Field(default=30.0, ge=0)
    # High availability: any number of pg2kafka processes may run for one slot; the one
    # holding a Postgres advisory lock streams, the others check every standby_poll_s.
    standby_poll_s: float = Field(default=1.0, gt=0, le=60)
    # Changes to tables without replica identity columns: emit them with an empty key,
    # or skip them (counted in walcast_pg2kafka_skipped_no_identity_total).
    no_identity: Literal["emit", "skip"] = "emit"

    @field_validator("slot")
    @classmethod
    def _slot_name(cls, v: str) -> str:
        if not _SLOT_RE.match(v):
            raise ValueError("slot names are 1-63 characters of a-z, 0-9 and _")
        return v


class FilterSettings(Section):
    """Which tables are streamed: ``schema.table`` patterns, ``*`` a wildcard.

    The default, every table, publishes ``FOR ALL TABLES``; anything narrower publishes
    the matching tables and adds new matching tables as they are created.
    """

    include: list[str] = Field(default_factory=lambda: ["*.*"], min_length=1)
    exclude: list[str] = Field(default_factory=list)

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for pattern in v:
            split_pattern(pattern)
        return v

    @property
    def all_tables(self) -> bool:
        return self.include == ["*.*"] and not self.exclude


class ProducerSettings(Section):
    """The Kafka side: where events go and how they are batched.

    Idempotence and acks=all are not configurable: the checkpoint depends on them.
    """

    topic: str = "walcast.cdc"
    partition_key: Literal["schema", "table", "primary_key"] = "schema"
    linger_ms: int = Field(default=20, ge=0, le=10_000)
    batch_bytes: int = Field(default=1_048_576, ge=1024)
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    # Memory guard: bytes handed to Kafka but not yet acknowledged. When full, pg2kafka
    # stops reading the slot until acks free room (backpressure, nothing dropped).
    max_inflight_bytes: int = Field(default=100 * 1024 * 1024, ge=1024 * 1024)
    # How long librdkafka keeps retrying one message before reporting it failed; a
    # failure stops the pipeline, which restarts from the last confirmed LSN.
    delivery_timeout_ms: int = Field(default=300_000, ge=1000)
    # Largest message the producer accepts (librdkafka message.max.bytes); the topic's
    # max.message.bytes must allow it too. 1 MB rows plus their envelope need headroom.
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=1_000_000)
    create_topic: bool = False
    topic_partitions: int = Field(default=6, ge=1)
    topic_replication_factor: int = Field(default=1, ge=1)


class Pg2KafkaSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="PG2KAFKA_")

    postgres: PostgresSettings = PostgresSettings()
    kafka: KafkaSettings = KafkaSettings()
    replication: ReplicationSettings = ReplicationSettings()
    filters: FilterSettings = FilterSettings()
    producer: ProducerSettings = ProducerSettings()
    http: HttpSettings = HttpSettings(port=9187)
