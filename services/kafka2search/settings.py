"""kafka2search's settings: env prefix ``KAFKA2SEARCH_``, optional YAML file; the reference in
docs/kafka2search.md is generated from this model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from shared.retry import BackoffPolicy
from shared.settings import (
    BatchSettings,
    ConsumerSettings,
    HttpSettings,
    KafkaSettings,
    SchemaRegistrySettings,
    Section,
    ServiceSettings,
    VerifySettings,
    check_table_template,
)


class Kafka2SearchConsumer(ConsumerSettings):
    group_id: str = Field(default="walcast-kafka2search", min_length=1)
    """The consumer group the instances share (partitions are divided among them)."""


class EngineSettings(Section):
    """The search engine: OpenSearch (opensearch-py) or Elasticsearch (elasticsearch-py,
    whose major version must match the server's)."""

    kind: Literal["opensearch", "elasticsearch"] = "opensearch"
    """The engine: OpenSearch, or Elasticsearch 8.x (elasticsearch-py 8.x)."""
    urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9200"], min_length=1)
    """The engine's nodes (`https://` enables TLS)."""
    username: str | None = None
    """Basic-auth user name (with `password`)."""
    password: SecretStr | None = None
    """Basic-auth password (a secret: masked everywhere)."""
    api_key: SecretStr | None = None
    """An Elasticsearch API key, as `id:key` or the base64 `encoded` form the API returns
    (a secret; not with `username`; Elasticsearch only)."""
    verify_certs: bool = True
    """Verify an `https` engine's certificate (against `ca_certs`, or the system's)."""
    ca_certs: Path | None = None
    """The CA certificate file (PEM) the engine's certificate is checked against."""
    client_cert: Path | None = None
    """A client certificate (PEM) for mutual TLS."""
    client_key: Path | None = None
    """The client certificate's key (PEM)."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds one request may take."""

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

    name_template: str = "walcast-{schema}.{table}"
    """The alias per table that readers use (`{db}`, `{schema}`, `{table}`; lower-cased and
    made a valid index name); the index behind it is `<alias>-v1`."""
    shards: int = Field(default=1, ge=1)
    """Primary shards of an index walcast creates."""
    replicas: int = Field(default=0, ge=0)
    """Replicas of an index walcast creates."""
    refresh_interval: str = "1s"
    """How soon a written document is searchable (the index's `refresh_interval`)."""
    gc_deletes: str = "1h"
    """How long the engine remembers a deleted document's version: an older event for it
    redelivered within this window stays stale instead of bringing the row back."""
    on_drop_table: Literal["delete", "retain"] = "retain"
    """What becomes of a dropped table's index: kept as it was, or deleted."""

    @field_validator("name_template")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_table_template(v, "an index")


class Kafka2SearchHttpSettings(HttpSettings):
    # A section given in the environment or YAML is built from the class defaults, so
    # the service's own defaults live on subclasses, not on default instances.
    port: int = Field(default=9188, ge=0, le=65535)
    """The port to listen on (0: any free port, logged at start)."""


class Kafka2SearchRetry(BackoffPolicy):
    give_up_after_s: float = Field(default=0.0, ge=0.0)
    """Seconds of failing attempts before giving up; 0 (the default here): never — the
    consumer waits out an engine outage with its partitions paused."""


class Kafka2SearchSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KAFKA2SEARCH_")

    kafka: KafkaSettings = KafkaSettings()
    consumer: Kafka2SearchConsumer = Kafka2SearchConsumer()
    batch: BatchSettings = BatchSettings()
    engine: EngineSettings = EngineSettings()
    index: IndexSettings = IndexSettings()
    http: Kafka2SearchHttpSettings = Kafka2SearchHttpSettings()
    retry: Kafka2SearchRetry = Kafka2SearchRetry()
    # walcast's events in Avro (the Confluent wire format): where their schemas are.
    schema_registry: SchemaRegistrySettings = SchemaRegistrySettings()
    # `kafka2search verify`: the indices compared with their Postgres tables.
    verify: VerifySettings = VerifySettings()
