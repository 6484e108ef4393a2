"""kafka2search's settings: env prefix ``KAFKA2SEARCH_``, optional YAML file (see README)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from shared.retry import BackoffPolicy
from shared.settings import (
    HttpSettings,
    KafkaSettings,
    Section,
    ServiceSettings,
    check_table_template,
)


class ConsumerSettings(Section):
    """The CDC topic(s) and the consumer group sharing their partitions."""

    topics: list[str] = Field(default_factory=lambda: ["walcast.cdc"], min_length=1)
    group_id: str = Field(default="walcast-kafka2search", min_length=1)
    # Poison messages and documents the engine refuses for good go here, with the reason.
    dlq_topic: str = Field(default="walcast.cdc.dlq", min_length=1)
    # The dead-letter topic is created with these when missing.
    dlq_partitions: int = Field(default=1, ge=1)
    dlq_replication_factor: int = Field(default=1, ge=1)
    # Where a group without committed offsets starts.
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    # librdkafka's prefetch budget: the bytes of fetched messages held before the service
    # takes them. With the batch budget below it bounds the consumer's memory.
    max_queue_bytes: int = Field(default=32 * 1024 * 1024, ge=1024 * 1024)
    session_timeout_ms: int = Field(default=30_000, ge=1000)
    # A bulk write retried longer than this makes the group think the member died.
    max_poll_interval_ms: int = Field(default=600_000, ge=10_000)


class BatchSettings(Section):
    """When the documents in hand are written: whichever limit comes first."""

    max_docs: int = Field(default=2000, ge=1)
    max_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_wait_s: float = Field(default=0.25, gt=0)
    # Bulk requests in flight at once: while some are indexed, the next batch is read.
    # More than the engine indexes at once (its write pool: one per core), so that it
    # never waits for the next request. Memory: (concurrency + 1) batch budgets.
    concurrency: int = Field(default=4, ge=1, le=8)


class EngineSettings(Section):
    """The search engine: OpenSearch (opensearch-py) or Elasticsearch (elasticsearch-py,
    whose major version must match the server's)."""

    kind: Literal["opensearch", "elasticsearch"] = "opensearch"
    urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9200"], min_length=1)
    username: str | None = None
    password: SecretStr | None = None
    # Elasticsearch API key, as "id:key" or the base64 "encoded" form the API returns.
    api_key: SecretStr | None = None
    # TLS: https URLs verify the server against ca_certs (or the system store).
    verify_certs: bool = True
    ca_certs: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    request_timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for url in v:
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return v

    @model_validator(mode="after")
    def _auth(self) -> EngineSettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("set both engine.username and engine.password, or neither")
        if self.api_key is not None and self.username is not None:
            raise ValueError("use engine.api_key or engine.username/password, not both")
        if self.api_key is not None and self.kind != "elasticsearch":
            raise ValueError(
                "engine.api_key is an Elasticsearch feature; OpenSearch uses username/password"
            )
        if self.ca_certs is not None and not self.ca_certs.is_file():
            raise ValueError(f"engine.ca_certs: {self.ca_certs} is not a file")
        return self


class IndexSettings(Section):
    """How tables become indices (see docs/kafka2search.md)."""

    # Alias readers use; the index behind it is "<alias>-v1" (a reindex swaps it). Fields:
    # {db}, {schema}, {table}; the result is lower-cased and made a valid index name.
    name_template: str = "walcast-{schema}.{table}"
    shards: int = Field(default=1, ge=1)
    replicas: int = Field(default=0, ge=0)
    refresh_interval: str = "1s"
    # How long the engine remembers a deleted document's version: a redelivered older
    # event for it within this window is recognised as stale, not resurrected.
    gc_deletes: str = "1h"
    on_drop_table: Literal["delete", "retain"] = "retain"

    @field_validator("name_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_table_template(v, "an index")


class Kafka2SearchHttpSettings(HttpSettings):
    # A section given in the environment or YAML is built from the class defaults, so
    # the service's own defaults live on subclasses, not on default instances.
    port: int = Field(default=9188, ge=0, le=65535)


class Kafka2SearchRetry(BackoffPolicy):
    # 0 = never give up: a consumer waits out an engine outage (partitions paused).
    give_up_after_s: float = Field(default=0.0, ge=0.0)


class Kafka2SearchSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KAFKA2SEARCH_")

    kafka: KafkaSettings = KafkaSettings()
    consumer: ConsumerSettings = ConsumerSettings()
    batch: BatchSettings = BatchSettings()
    engine: EngineSettings = EngineSettings()
    index: IndexSettings = IndexSettings()
    http: Kafka2SearchHttpSettings = Kafka2SearchHttpSettings()
    retry: Kafka2SearchRetry = Kafka2SearchRetry()
