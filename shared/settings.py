"""Settings: frozen pydantic-settings models, one env prefix per service, optional YAML file.

Each service defines one subclass of :class:`ServiceSettings` with its own ``env_prefix``
(``PG2KAFKA_``, ``KAFKA2SEARCH_``, ``KAFKA2SPARK_``) and loads it once, at start-up, with
:func:`load_settings`. Nested models use ``__`` in variable names
(``PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS``) and dotted keys in YAML (``kafka.bootstrap_servers``).

Precedence, highest first: explicit arguments, environment, the env file, the YAML file,
defaults. Everything is validated before anything connects; an unknown key — in the YAML
file, the environment or the env file — is an error, because a typo that silently falls
back to a default is the worst kind of misconfiguration. Errors name the bad key in both
spellings. Secrets are :class:`~pydantic.SecretStr`; what counts as one in the free-form
maps (``kafka.extra``, ``spark.conf``) and in URLs, and how it is masked, is decided in
:mod:`shared.secrets` — :meth:`ServiceSettings.effective` and configuration errors use it.

Library code never reads the environment: only a service's entry point calls
:func:`load_settings` and passes the model (or parts of it) down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

from shared.errors import ConfigError
from shared.formats.debezium_input import InputFormat
from shared.retry import BackoffPolicy
from shared.secrets import is_secret_key, masked, scrub

S = TypeVar("S", bound="ServiceSettings")

_yaml_file: ContextVar[Path | None] = ContextVar("walcast_yaml_file", default=None)
_env_file: ContextVar[Path | None] = ContextVar("walcast_env_file", default=None)


class Section(BaseModel):
    """Base for nested settings groups: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


# libpq options every walcast Postgres session starts with (see PostgresSettings.conninfo).
SAFE_SEARCH_PATH = "-c search_path=pg_catalog,pg_temp"


class PostgresSettings(Section):
    """Where the source database is. ``conninfo()`` contains the password: never log it."""

    host: str = "127.0.0.1"
    """The server's host name, address or Unix socket directory."""
    port: int = Field(default=5432, ge=1, le=65535)
    """The server's port."""
    database: str = "postgres"
    """The database to stream (a slot belongs to one database)."""
    user: str = "postgres"
    """The role walcast connects as (its privileges: [security.md](security.md))."""
    password: SecretStr = SecretStr("")
    """The role's password (a secret: masked everywhere); empty: none, or `~/.pgpass`."""
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "prefer"
    """libpq's `sslmode`: whether TLS is used and how the server is verified."""
    sslrootcert: str | None = None
    """The CA certificate file (PEM) that `verify-ca` / `verify-full` check the server
    against (libpq's `sslrootcert`; `system`: the system's trusted CAs); unset: libpq's
    default."""
    connect_timeout_s: int = Field(default=10, ge=1)
    """Seconds a connection attempt may take."""
    application_name: str = "walcast"
    """The name sessions show in `pg_stat_activity`."""

    def conninfo(self, **extra: str) -> str:
        """libpq key=value string (values quoted), for psycopg; contains the secret.

        Every session walcast opens searches only ``pg_catalog`` then ``pg_temp``
        (:data:`SAFE_SEARCH_PATH`): an unqualified call can never resolve to a function a
        database user created in ``public`` or a ``$user`` schema, which would then run with
        walcast's privileges. ``extra["options"]`` is appended after it; a caller passing
        libpq ``options`` to ``psycopg.connect`` directly must start them with
        :data:`SAFE_SEARCH_PATH` (a keyword argument replaces the string's).
        """
        options = SAFE_SEARCH_PATH + (" " + extra.pop("options") if "options" in extra else "")
        params: dict[str, str] = {
            "host": self.host,
            "port": str(self.port),
            "dbname": self.database,
            "user": self.user,
            "sslmode": self.sslmode,
            "connect_timeout": str(self.connect_timeout_s),
            "application_name": self.application_name,
            # Results in UTF-8 whatever the database's encoding (a LATIN1 server converts;
            # a SQL_ASCII one sends bytes as they are, which Python reads as UTF-8).
            "client_encoding": "UTF8",
            "options": options,
            **extra,
        }
        if self.sslrootcert is not None:
            params["sslrootcert"] = self.sslrootcert
        password = self.password.get_secret_value()
        if password:
            params["password"] = password
        return " ".join(f"{k}='{_libpq_quote(v)}'" for k, v in params.items())


def _libpq_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


class VerifySettings(Section):
    """`verify`: comparing the sink with its Postgres tables
    ([design.md](design.md#verification))."""

    postgres: PostgresSettings = PostgresSettings()
    """The source database: a role in `walcast_verifier`, with `SELECT` on the tables
    verified, and in `walcast_repairer` to `repair` ([security.md](security.md))."""
    slot: str = Field(default="walcast", min_length=1)
    """pg2kafka's replication slot (its `replication.slot`): a marker is in Kafka once
    the slot has passed it."""
    range_rows: int = Field(default=10_000, ge=1, le=1 << 21)
    """The most rows one range holds: a range compares by count and hash sum, and only
    the rows of a range that differs are read."""
    rounds: int = Field(default=3, ge=2, le=20)
    """Rounds that look at the rows of differing ranges; a row still changing after the
    last is reported as changing, not as a difference."""
    rows_per_s: float | None = Field(default=None, gt=0)
    """The most rows per second read from Postgres (unset: no bound), all connections
    together."""
    workers: int = Field(default=2, ge=1, le=16)
    """Postgres connections reading a table's ranges at once (each range still its own
    short transaction); 1: one scan finds each range's bound as it reads it."""
    mark_timeout_s: float = Field(default=120.0, gt=0)
    """Seconds without progress towards a marker (pg2kafka streaming it, the sink
    applying it) before verify gives up, saying how far each got."""
    horizon_wait_s: float = Field(default=60.0, ge=0)
    """A row missing from the sink is confirmed only by a read that sees every
    transaction that was running at the sink's previous read (a delete the sink already
    applied would show there). A round waits up to this long for the oldest of them to
    end — another session's long transaction holds it back — before reading; past it,
    the row is looked at again next round, and reported as changing after the last."""
    interval_s: float = Field(default=0.0, ge=0)
    """Inside `run`: every this many seconds, the next table in rotation is verified,
    its outcome in the metrics (`walcast_verify_*`) and in `status`; 0: off (the command
    `verify` only)."""
    values: bool = False
    """kafka2search: also check that every document is as the service wrote it (its
    stamp), which sees a value changed through the engine's API (the row's hash stays as
    written); reads every document's `_source`. Off: the hash sums, and the stamps of the
    ranges whose sums differ. kafka2spark: no effect — rows another writer changed are
    found in the mirror's Delta log on every verification."""
    retry: BackoffPolicy = BackoffPolicy(initial_s=1.0, max_s=10.0, give_up_after_s=180.0)
    """A table's verification cut short by a transient failure (Postgres restarting, the
    engine or Kafka out of reach) starts again after these waits, from a new marker; a
    marker not reached within `mark_timeout_s` is not waited for again."""
    repair_attempts: int = Field(default=3, ge=1, le=20)
    """`repair`: how many times the key ranges still different after a repair are read
    again (a key the sink holds at a version newer than the read's waits for a later
    one)."""


class KafkaSettings(Section):
    """Connection to the Kafka cluster, shared by producers and consumers."""

    bootstrap_servers: str = "127.0.0.1:9092"
    """Brokers to start from, `host:port` separated by commas."""
    client_id: str = "walcast"
    """The client id the brokers log and meter."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """How to talk to the brokers: TLS, SASL authentication, both or neither."""
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    """The SASL mechanism (with a `SASL_*` protocol)."""
    sasl_username: str | None = None
    """The SASL user name."""
    sasl_password: SecretStr | None = None
    """The SASL password (a secret: masked everywhere)."""
    ssl_ca_location: Path | None = None
    """The CA certificate file (PEM) the brokers' certificates are checked against; unset:
    the system's."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Any librdkafka setting walcast has no field for, passed verbatim (applied last; keys
    that name a secret are masked)."""

    def client_config(self) -> dict[str, Any]:
        """librdkafka configuration common to producers, consumers and admin clients."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location is not None:
            conf["ssl.ca.location"] = str(self.ssl_ca_location)
        conf.update(self.extra)
        return conf


class ConsumerSettings(Section):
    """The CDC topic(s) and the consumer group sharing their partitions (the shared
    consumer loop, :mod:`shared.consumer`). Each service gives ``group_id`` its own
    default."""

    topics: list[str] = Field(default_factory=lambda: ["walcast.cdc"], min_length=1)
    """The topics to read."""
    input_format: InputFormat = "walcast"
    """What the topics hold: walcast's change events, Debezium records (the PostgreSQL
    connector's, JSON converter with schemas), or either, told apart record by record
    (`auto`). walcast's events in Avro (the Confluent wire format) are read under
    `walcast` and `auto` when `schema_registry.url` is set ([events.md](events.md))."""
    group_id: str = Field(default="walcast-consumer", min_length=1)
    """The consumer group the instances share (partitions are divided among them)."""
    dlq_topic: str = Field(default="walcast.cdc.dlq", min_length=1)
    """The dead-letter topic: unreadable records and records the sink refuses for good go
    there, with the reason in a header; created when missing."""
    dlq_partitions: int = Field(default=1, ge=1)
    """Partitions of the dead-letter topic when walcast creates it."""
    dlq_replication_factor: int = Field(default=1, ge=1)
    """Replication factor of the dead-letter topic when walcast creates it."""
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    """Where a group without committed offsets starts."""
    max_queue_bytes: int = Field(default=32 * 1024 * 1024, ge=1024 * 1024)
    """librdkafka's prefetch budget: bytes of fetched records held before the service takes
    them (with the batch budget, the consumer's memory bound; at least 1 MiB)."""
    fetch_backoff_ms: int = Field(default=10, ge=1, le=1000)
    """How soon librdkafka fetches again once the prefetch budget is full (its
    `fetch.queue.backoff.ms`). Its own default, 1000, held a consumer that takes records
    faster than the budget refills to about one budget per second (~190k records/s here,
    against 1.0M to 1.4M at 10: docs/benchmarks.md); the budget still bounds memory."""
    session_timeout_ms: int = Field(default=10_000, ge=6000)
    """How long the group waits for a member that stopped heartbeating (killed, host gone)
    before its partitions go to the others; a member killed and restarted waits about as
    long for its partitions (at least 6000)."""
    group_instance_id: str | None = Field(default=None, min_length=1)
    """Static membership (Kafka's `group.instance.id`): a member restarted under the same
    id within the session timeout gets its partitions back without a rebalance. Give each
    replica a stable, unique id (a StatefulSet pod name); unset: dynamic membership."""
    max_poll_interval_ms: int = Field(default=600_000, ge=10_000)
    """How long one write (with its retries) may hold the loop before the group thinks the
    member died."""
    commit_timeout_s: float = Field(default=30.0, gt=0, le=120)
    """How long a waited-for offset commit (before partitions change owner, at a barrier,
    at shutdown) or a consumer's close may take; past it the member reconnects with a new
    consumer. At most half of `max_poll_interval_ms` and 120."""

    @model_validator(mode="after")
    def _commit_within_poll_interval(self) -> ConsumerSettings:
        if self.commit_timeout_s * 2000 > self.max_poll_interval_ms:
            raise ValueError(
                f"commit_timeout_s ({self.commit_timeout_s:g}) must be at most half of"
                f" max_poll_interval_ms ({self.max_poll_interval_ms}) in seconds"
            )
        return self


class SchemaRegistrySettings(Section):
    """A Confluent-compatible schema registry, for the Avro encoding (docs/events.md,
    "Avro"): pg2kafka registers its schemas there, the sinks fetch writer schemas by id.
    Spoken to through confluent-kafka's standard registry client; ``mock://<name>`` is
    that client's in-memory registry (tests)."""

    url: str | None = Field(default=None, pattern=r"^(https?|mock)://")
    """The registry (`http(s)://...`; `mock://name`: the client's in-memory one, for
    tests); unset: no Avro."""
    username: str | None = None
    """Basic-auth user name."""
    password: SecretStr | None = None
    """Basic-auth password (a secret: masked everywhere)."""
    ssl_ca_location: Path | None = None
    """The CA certificate file (PEM) an `https` registry is checked against."""
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    """Subject names: `topic` (`<topic>-value`, Confluent's default: one table per topic),
    `record` (the record's name) or `topic_record` (`<topic>-<record name>`: several
    tables in one topic)."""

    def client(self) -> Any:
        """confluent-kafka's ``SchemaRegistryClient`` (holds the password: never log it)."""
        from shared.avro import registry_client

        if self.url is None:
            raise ConfigError("schema_registry.url is not set")
        conf: dict[str, Any] = {}
        if self.username is not None:
            password = self.password.get_secret_value() if self.password else ""
            conf["basic.auth.user.info"] = f"{self.username}:{password}"
        if self.ssl_ca_location is not None:
            conf["ssl.ca.location"] = str(self.ssl_ca_location)
        return registry_client(self.url, conf)


class BatchSettings(Section):
    """When the records in hand are written: whichever limit comes first."""

    max_docs: int = Field(default=2000, ge=1)
    """Records in one write at most."""
    max_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Bytes of records in one write at most."""
    max_wait_s: float = Field(default=0.25, gt=0)
    """Seconds the first record of a batch waits for more before the batch is written."""
    # For a search engine, more than it indexes at once (its write pool: one per core),
    # so that it never waits for the next request.
    concurrency: int = Field(default=4, ge=1, le=8)
    """Writes in flight at once (1 to 8): while some are written, the next batch is read.
    Memory: `concurrency` + 1 batch budgets."""


class HttpSettings(Section):
    """The /metrics, /health and /ready endpoint of a service."""

    enabled: bool = True
    """Serve `/metrics` (Prometheus), `/health` and `/ready`."""
    host: str = "127.0.0.1"
    """The address to listen on (`0.0.0.0` in a container)."""
    port: int = Field(default=9187, ge=0, le=65535)
    """The port to listen on (0: any free port, logged at start)."""


class LoggingSettings(Section):
    """The service's log, on standard error."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """The least severe level written."""
    format: Literal["json", "text"] = "json"
    """`json`: one object per line; `text`: for people."""


class ServiceSettings(BaseSettings):
    """Base of every service's settings; subclasses set ``env_prefix`` and add sections."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_nested_delimiter="__",
        case_sensitive=False,
        env_file_encoding="utf-8",
        use_attribute_docstrings=True,
    )

    log: LoggingSettings = LoggingSettings()
    http: HttpSettings = HttpSettings()
    retry: BackoffPolicy = BackoffPolicy()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        env_file = _env_file.get()
        if env_file is not None:
            sources.append(_EnvFileSource(settings_cls, env_file))
        yaml_file = _yaml_file.get()
        if yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)

    def effective(self) -> dict[str, Any]:
        """The configuration in force as JSON-ready data, safe to log or print: secrets
        (``SecretStr``, secret keys of ``kafka.extra`` / ``spark.conf``, URL passwords)
        masked by :func:`shared.secrets.masked`."""
        config: dict[str, Any] = masked(self)
        return config


class _EnvFileSource(EnvSettingsSource):
    """A dotenv file read like the environment, keeping only this service's prefix.

    pydantic-settings' own dotenv source treats every other line as an unknown key under
    ``extra="forbid"``; the local stack's env file holds settings for every service.
    """

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self._path = path
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        prefix = self.env_prefix.upper()
        mine = {k: v for k, v in _read_dotenv(self._path).items() if k.upper().startswith(prefix)}
        return parse_env_vars(
            mine, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )


def load_settings(
    cls: type[S],
    *,
    config_file: Path | str | None = None,
    env_file: Path | str | None = None,
    **overrides: Any,
) -> S:
    """Build and validate a service's settings, or raise :class:`ConfigError`.

    ``config_file`` is the optional YAML file; ``env_file`` an optional dotenv file (the
    local stack writes one). The process environment and the env file are both checked
    for unknown keys under the service's prefix.
    """
    prefix = str(cls.model_config.get("env_prefix", ""))
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(
                f"config file {path} does not exist",
                hint="pass an existing YAML file or omit --config",
            )
    env_path = Path(env_file) if env_file is not None else None
    if env_path is not None and not env_path.is_file():
        raise ConfigError(
            f"env file {env_path} does not exist",
            hint="run `deploy/local/walcast up` or pass an existing file",
        )

    _reject_unknown_env(cls, prefix, os.environ, "environment")
    if env_path is not None:
        _reject_unknown_env(cls, prefix, _read_dotenv(env_path), str(env_path))

    yaml_token = _yaml_file.set(Path(config_file) if config_file is not None else None)
    env_token = _env_file.set(env_path)
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise ConfigError(
            _describe(exc, prefix), hint="fix the named keys (environment, env file or YAML)"
        ) from None
    finally:
        _env_file.reset(env_token)
        _yaml_file.reset(yaml_token)


def _read_dotenv(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        values[key.strip()] = value.strip()
    return values


def _reject_unknown_env(
    cls: type[BaseModel], prefix: str, env: Mapping[str, str], origin: str
) -> None:
    if not prefix:
        return
    upper_prefix = prefix.upper()
    for key in env:
        if not key.upper().startswith(upper_prefix):
            continue
        path = key[len(prefix) :].lower().split("__")
        problem = _unknown_path(cls, path)
        if problem:
            raise ConfigError(
                f"unknown setting {key} (in the {origin}): {problem}",
                hint="remove it or correct the spelling",
            )


def _unknown_path(model: type[BaseModel], path: list[str]) -> str:
    fields = model.model_fields
    name = path[0]
    if name not in fields:
        return f"no key {name!r}; valid keys: {', '.join(sorted(fields))}"
    if len(path) == 1:
        return ""
    annotation = fields[name].annotation
    nested = (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )
    if nested is None:
        # A dict-valued field (for example kafka.extra) accepts arbitrary sub-keys.
        return ""
    return _unknown_path(nested, path[1:])


def _describe(exc: ValidationError, prefix: str) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        dotted = ".".join(loc)
        env_key = prefix.upper() + "__".join(loc).upper()
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        shown = ""
        if (
            "input" in err
            and not is_secret_key(dotted)
            and err["type"] != "extra_forbidden"
            and not isinstance(err["input"], dict)
        ):
            shown = f" (got {err['input']!r})"
        lines.append(f"{env_key} / {dotted}: {msg}{shown}")
    # A validator's message may quote the bad value (an engine URL with its password).
    return scrub("invalid configuration: " + "; ".join(lines))


def check_table_template(template: str, what: str) -> str:
    """A name template over ``{db}``, ``{schema}``, ``{table}``; ``{table}`` is required,
    or two tables would share one ``what`` (index, directory...)."""
    try:
        template.format(db="d", schema="s", table="t")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"unknown field in {template!r}: {exc}; use {{db}} {{schema}} {{table}}"
        ) from exc
    if "{table}" not in template:
        raise ValueError(f"the template must contain {{table}}, or tables would share {what}")
    return template
