"""kafka2webhook's settings: env prefix ``KAFKA2WEBHOOK_``, optional YAML file; the reference
in docs/kafka2webhook.md is generated from this model.

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
    """The dotted path of the field tested (`new.status`, `old.total`, `table`; with
    `input: events`, a path in the payload). A field the event does not have fails every
    test but `exists: false`."""
    equals: Any = None
    """Holds when the field equals this JSON value."""
    one_of: list[Any] | None = None
    """Holds when the field equals one of these JSON values."""
    exists: bool | None = None
    """`true`: holds when the field is present and not null; `false`: when it is absent or
    null."""

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
    """The endpoint's name, unique: 1-63 of a-z, 0-9 and `_`, not starting with `_`. It
    names its consumer group (`<consumer.group_id>.<name>`), its metrics (label `webhook`)
    and its secret's env var."""
    url: str
    """The `http://` or `https://` URL events are POSTed to, checked at start-up (a host
    and a port the client can use, visible ASCII only). Redirects are not followed."""
    secret: SecretStr | None = None
    """The key its events are signed with (Standard Webhooks, see
    [What a receiver gets](#what-a-receiver-gets)): at least 16 bytes without surrounding
    whitespace or control characters, or `whsec_` + strict base64 of at least 24 bytes.
    Unset: `secrets.<name>`, which must then be set."""
    input: Literal["cdc", "events"] = "cdc"
    """What it reads: `cdc`, the change events of `consumer.topics`; `events`, the
    subscription events topic (`events_topic`), whose payloads the subscriptions shaped
    ([subscriptions.md](subscriptions.md))."""
    tables: list[str] = Field(default_factory=lambda: ["*.*"], min_length=1)
    """With `input: cdc`: the tables whose change events it gets, as `schema.table`
    patterns (`*` matches any text). Ignored with `input: events`."""
    subscriptions: list[str] = Field(default_factory=lambda: ["*"], min_length=1)
    """With `input: events`: the subscription keys (`tg_name`) whose events it gets (`*`
    matches any text). Ignored with `input: cdc`."""
    operations: list[Operation] = Field(
        default_factory=lambda: list[Operation](["insert", "update", "delete"]), min_length=1
    )
    """With `input: cdc`: the operations it gets (`read`: snapshot rows; a `truncate` or
    `ddl` comes after every event before it; `event` matches no change event). Ignored
    with `input: events`."""
    filter: list[Condition] = Field(default_factory=list)
    """Conditions on the event's fields, all of which must hold (AND); empty: every event
    the tables and operations (or subscriptions) choose."""
    batch_size: int = Field(default=1, ge=1, le=1000)
    """Events per POST at most (1 to 1000). `1`: one POST per event, its body the event;
    more: a JSON array of `{"webhook_id": <id>, "event": <event>}`, a key's events in
    order."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra request headers, not secrets (they are logged with the settings): names HTTP
    tokens, values visible ASCII, spaces and tabs. `content-type`, `webhook-id`,
    `webhook-timestamp`, `webhook-signature` and `walcast-*` are refused (set by
    kafka2webhook)."""

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
    """How each event is delivered: the attempt deadline, retries and their budget,
    parallelism."""

    timeout_s: float = Field(default=10.0, ge=0.1, le=300)
    """Seconds one attempt may take, all of it: connecting, TLS, sending, the answer's
    status, headers and body; past it the attempt failed (retried), and a stopping service
    waits this long at most for the requests in flight. 0.1 to 300, and at most
    `give_up_after_s`."""
    initial_backoff_s: float = Field(default=0.5, gt=0)
    """Seconds before the first retry; the wait doubles after each failed attempt, up to
    `max_backoff_s`. Retried: connection failures, attempts past their deadline, malformed
    answers, 408, 425, 429, 5xx and statuses below 200 or above 599; any other answer is
    final."""
    max_backoff_s: float = Field(default=60.0, gt=0)
    """The longest wait between attempts, in seconds, also for a `Retry-After` answer
    (which is honoured up to it); at least `initial_backoff_s`."""
    jitter: float = Field(default=0.5, ge=0, le=1)
    """Random spread of each backoff wait, as a fraction of it (0.5: ±50 %), 0 to 1; a
    `Retry-After` wait is not spread."""
    give_up_after_s: float = Field(default=900.0, gt=0)
    """An event's retry budget in seconds, from its first attempt: when the next wait would
    end past it, the event goes to the dead-letter topic with its last status and an
    excerpt of the answer's body."""
    max_attempts: int = Field(default=0, ge=0)
    """Attempts per event at most before it goes to the dead-letter topic; 0: no count,
    only `give_up_after_s`."""
    parallel_keys: int = Field(default=8, ge=1, le=256)
    """Lanes delivering at once per endpoint (1 to 256), keys spread over them: the events
    of one key go through one lane, one after another."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "signature_tolerance_s" in data:
            raise ValueError(
                "delivery.signature_tolerance_s was removed: kafka2webhook never used it."
                " The replay tolerance is the receiver's to choose when it verifies a"
                ' signature (docs/kafka2webhook.md, "What a receiver gets"); delete the key'
            )
        return data

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
    """The CDC topic(s) the `cdc` endpoints read, and their consumer groups (the shared
    consumer loop). `input_format` must be `walcast`: kafka2webhook posts walcast's JSON
    change events, and Avro topics are not read."""

    group_id: str = Field(default="walcast-kafka2webhook", min_length=1)
    """The prefix of the endpoints' consumer groups: each endpoint reads with its own,
    `<group_id>.<endpoint name>`, so one that is slow or down holds back only its own
    offsets."""
    dlq_topic: str = Field(default="walcast.webhooks.dlq", min_length=1)
    """The dead-letter topic: events given up on, as they were read, with the endpoint,
    the source position and the reason in headers, and unreadable records; created when
    missing."""


class Kafka2WebhookBatch(BatchSettings):
    """Records read per endpoint before a delivery round. One write at a time keeps each
    key's order across batches (and bounds what a stalled endpoint holds: one batch)."""

    max_docs: int = Field(default=500, ge=1)
    """Records read per endpoint before a delivery round at most, wanted by it or not;
    bounds what an endpoint holds while its receiver is down."""
    max_wait_s: float = Field(default=0.1, gt=0)
    """Seconds the first record of a batch waits for more before the delivery round."""
    concurrency: int = Field(default=1, ge=1, le=1)
    """Delivery rounds in flight per endpoint: always 1, which keeps each key's order
    across batches."""


class Kafka2WebhookHttpSettings(HttpSettings):
    """The /metrics, /health and /ready endpoint of a service."""

    # A section given in the environment or YAML is built from the class defaults, so
    # the service's own defaults live on subclasses, not on default instances (a default
    # instance lost port 9190 as soon as any http.* key was set).
    port: int = Field(default=9190, ge=0, le=65535)
    """The port to listen on (0: any free port, logged at start)."""


class Kafka2WebhookSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KAFKA2WEBHOOK_")

    kafka: KafkaSettings = KafkaSettings()
    consumer: Kafka2WebhookConsumer = Kafka2WebhookConsumer()
    batch: Kafka2WebhookBatch = Kafka2WebhookBatch()
    events_topic: str = Field(default="walcast.events", min_length=1)
    """The subscription events topic (pg2kafka's `subscriptions.topic`), read by the
    endpoints with `input: events`."""
    endpoints: list[EndpointSettings] = Field(default_factory=list)
    """The receivers (a JSON list in env vars), with unique names; each reads with its own
    consumer group."""
    secrets: dict[str, SecretStr] = Field(default_factory=dict)
    """Signing secrets by endpoint name (`KAFKA2WEBHOOK_SECRETS__ORDERS` for `orders`), for
    endpoints without their own `secret`, which takes precedence; the same rules as
    `endpoints[].secret`. A name no endpoint has is refused."""
    delivery: DeliverySettings = DeliverySettings()
    http: Kafka2WebhookHttpSettings = Kafka2WebhookHttpSettings()

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
