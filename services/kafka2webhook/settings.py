"""kafka2webhook's settings: env prefix ``KAFKA2WEBHOOK_``, optional YAML file (see README).

Endpoints are a list (in env vars, JSON: ``KAFKA2WEBHOOK_ENDPOINTS='[{"name": ...}]'``);
each endpoint's signing secret may also come alone from ``secrets.<name>``
(``KAFKA2WEBHOOK_SECRETS__<NAME>``), so the list itself can live in a ConfigMap and the
secrets in a Secret.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from services.kafka2webhook.signing import secret_problem
from services.kafka2webhook.untrusted import header_name_ok, header_value_ok
from shared.settings import (
    BatchSettings,
    ConsumerSettings,
    HttpSettings,
    KafkaSettings,
    Section,
    ServiceSettings,
)

Operation = Literal["insert", "update", "delete", "read", "truncate", "ddl", "event"]
_NAME = re.compile(r"^[a-z0-9][a-z0-9_]{0,62}$")
_PATTERN = re.compile(r"^[^.]+\.[^.]+$")


class Condition(Section):
    """One test on a field of the event (``new.status``, ``old.total``, ``table``; for
    subscription events a path in the payload): ``equals`` a value, is ``one_of`` some
    values, or ``exists`` (present and not null) or not. Data, never code."""

    field: str = Field(min_length=1)
    equals: Any = None
    one_of: list[Any] | None = None
    exists: bool | None = None

    @model_validator(mode="after")
    def _one_test(self) -> Condition:
        given = [k for k in ("equals", "one_of", "exists") if k in self.model_fields_set]
        if len(given) != 1:
            raise ValueError(
                f"condition on {self.field!r}: give exactly one of equals, one_of, exists"
            )
        return self


class EndpointSettings(Section):
    """One receiver: what it subscribes to, and how it is called."""

    name: str
    url: str
    # The key events are signed with (Standard Webhooks: docs/kafka2webhook.md): at
    # least 16 bytes, or whsec_ + strict base64 of at least 24 bytes. Or in ``secrets``
    # under the endpoint's name.
    secret: SecretStr | None = None
    # What it reads: change events ("cdc": consumer.topics) or the subscription events
    # topic ("events": events_topic), whose payloads the subscriptions shaped.
    input: Literal["cdc", "events"] = "cdc"
    # cdc: schema.table patterns (* a wildcard); events: subscription keys (tg_name).
    tables: list[str] = Field(default_factory=lambda: ["*.*"], min_length=1)
    subscriptions: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    operations: list[Operation] = Field(
        default_factory=lambda: list[Operation](["insert", "update", "delete"]), min_length=1
    )
    # Every condition must hold (AND); none: every event of the tables and operations.
    filter: list[Condition] = Field(default_factory=list)
    # 1: one POST per event (its body the event). More: up to this many events per POST,
    # a JSON array, events of one key in order within it.
    batch_size: int = Field(default=1, ge=1, le=1000)
    # Extra request headers (not secrets: they are logged with the settings).
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(
                f"{v!r}: an endpoint name is 1-63 of a-z, 0-9 and '_' (it names its"
                " consumer group, its metrics and its secret's env var)"
            )
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v) or not header_value_ok(v):
            raise ValueError(f"{v!r} is not an http(s) URL")
        try:
            parse_url(v)  # what the client will do with it: a bad port or host fails here
        except LocationParseError:
            raise ValueError(f"{v!r} is not an http(s) URL the client can reach") from None
        return v

    @field_validator("tables")
    @classmethod
    def _tables(cls, v: list[str]) -> list[str]:
        for p in v:
            if not _PATTERN.match(p):
                raise ValueError(f"{p!r}: a table pattern is schema.table (with * wildcards)")
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = {"content-type", "webhook-id", "webhook-timestamp", "webhook-signature"}
        for name, value in v.items():
            if name.lower() in reserved or name.lower().startswith("walcast-"):
                raise ValueError(f"header {name!r} is set by kafka2webhook itself")
            if not header_name_ok(name):
                raise ValueError(f"header name {name!r} is not an HTTP token (RFC 9110)")
            if not header_value_ok(value):
                raise ValueError(
                    f"header {name!r}: its value may hold visible ASCII, spaces and tabs"
                    " only (no CR, LF, other controls or non-ASCII characters)"
                )
        return v


class DeliverySettings(Section):
    """How each event is delivered: timeouts, the retry budget, parallelism, memory."""

    # The deadline of one attempt, all of it: connecting, TLS, sending, the answer's
    # status, headers and body. Past it the attempt failed (retried); a stopping service
    # waits this long at most for the requests in flight.
    timeout_s: float = Field(default=10.0, ge=0.1, le=300)
    # Retries (connection errors, timeouts, 408, 425, 429, 5xx): exponential from
    # initial_s to max_s with jitter; a Retry-After answer is honoured (up to max_s).
    initial_backoff_s: float = Field(default=0.5, gt=0)
    max_backoff_s: float = Field(default=60.0, gt=0)
    jitter: float = Field(default=0.5, ge=0, le=1)
    # The retry budget of one event: after this long (or max_attempts, 0 = no count) it
    # goes to the dead-letter topic with its last status and body excerpt.
    give_up_after_s: float = Field(default=900.0, gt=0)
    max_attempts: int = Field(default=0, ge=0)
    # Keys delivered at once per endpoint (events of one key: one after another).
    parallel_keys: int = Field(default=8, ge=1, le=256)
    # Replay protection the receivers are told about (docs): signatures older than this
    # should be refused by them; sent as a header for their information.
    signature_tolerance_s: int = Field(default=300, ge=1)

    @model_validator(mode="after")
    def _backoff(self) -> DeliverySettings:
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("delivery.max_backoff_s must be at least initial_backoff_s")
        if self.timeout_s > self.give_up_after_s:
            raise ValueError(
                "delivery.timeout_s (one attempt's deadline) must not exceed"
                " delivery.give_up_after_s (an event's whole retry budget)"
            )
        return self


class Kafka2WebhookConsumer(ConsumerSettings):
    # Each endpoint is its own consumer group, "<group_id>.<endpoint name>": an endpoint
    # that is slow or down holds back only its own offsets.
    group_id: str = Field(default="walcast-kafka2webhook", min_length=1)
    dlq_topic: str = Field(default="walcast.webhooks.dlq", min_length=1)


class Kafka2WebhookBatch(BatchSettings):
    """Records read per endpoint before a delivery round. One write at a time keeps each
    key's order across batches (and bounds what a stalled endpoint holds: one batch)."""

    max_docs: int = Field(default=500, ge=1)
    max_wait_s: float = Field(default=0.1, gt=0)
    concurrency: int = Field(default=1, ge=1, le=1)


class Kafka2WebhookSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KAFKA2WEBHOOK_")

    kafka: KafkaSettings = KafkaSettings()
    consumer: Kafka2WebhookConsumer = Kafka2WebhookConsumer()
    batch: Kafka2WebhookBatch = Kafka2WebhookBatch()
    events_topic: str = Field(default="walcast.events", min_length=1)
    endpoints: list[EndpointSettings] = Field(default_factory=list)
    # Signing secrets by endpoint name (KAFKA2WEBHOOK_SECRETS__ORDERS=...), for endpoints
    # that do not carry their own.
    secrets: dict[str, SecretStr] = Field(default_factory=dict)
    delivery: DeliverySettings = DeliverySettings()
    http: HttpSettings = HttpSettings(port=9190)

    @model_validator(mode="after")
    def _endpoints(self) -> Kafka2WebhookSettings:
        names = [e.name for e in self.endpoints]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"endpoint names must be unique: {twice}")
        if self.consumer.input_format != "walcast":
            raise ValueError(
                "kafka2webhook posts walcast's JSON change events: consumer.input_format"
                " must be walcast"
            )
        unknown = sorted(set(self.secrets) - set(names))
        if unknown:
            raise ValueError(f"secrets for endpoints that do not exist: {unknown}")
        for e in self.endpoints:
            where = (
                f"endpoints[].secret, or secrets.{e.name}: KAFKA2WEBHOOK_SECRETS__{e.name.upper()}"
            )
            secret = e.secret or self.secrets.get(e.name)
            if secret is None:
                raise ValueError(f"endpoint {e.name}: a signing secret is needed ({where})")
            problem = secret_problem(secret.get_secret_value().encode())
            if problem is not None:
                raise ValueError(f"endpoint {e.name}: its signing secret ({where}) {problem}")
        return self

    def secret_of(self, endpoint: EndpointSettings) -> bytes:
        """The endpoint's signing key (validated present at start-up)."""
        secret = endpoint.secret or self.secrets[endpoint.name]
        return secret.get_secret_value().encode()
