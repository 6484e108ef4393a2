"""pg2kafka's settings: env prefix ``PG2KAFKA_``, optional YAML file; the reference in
docs/pg2kafka.md is generated from this model."""

from __future__ import annotations

import os
import re
import string
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.pg2kafka.filters import split_pattern
from shared.settings import (
    HttpSettings,
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    Section,
    ServiceSettings,
)

_SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")


def plain_name(v: str) -> str:
    """Slot and publication names: pgoutput reads publication_names as an unquoted
    identifier list, so upper case or commas would silently name another publication;
    slot names allow only these characters anyway."""
    if not _SLOT_RE.match(v):
        raise ValueError("use 1-63 characters of a-z, 0-9 and _")
    return v


INSERTS_SUFFIX = "_ins"


def inserts_publication(publication: str) -> str:
    """The insert-only publication that accompanies ``publication`` under
    ``filters.keyless_tables=inserts`` (init creates it; pg2kafka streams it with the main
    one when it exists). At most 63 bytes when ``publication`` is at most 59: the
    settings refuse a longer one under ``inserts`` (:class:`Pg2KafkaSettings`)."""
    return publication + INSERTS_SUFFIX


class ReplicationSettings(Section):
    """The slot and publication pg2kafka streams from (created by ``pg2kafka init``)."""

    slot: str = "walcast"
    """The logical replication slot (a-z, 0-9, _)."""
    publication: str = "walcast"
    """The publication `init` creates: the tables the filters match."""
    status_interval_s: float = Field(default=5.0, gt=0, le=30)
    """Seconds between standby status updates; must stay well under the server's
    wal_sender_timeout (60 s by default) or Postgres drops the connection."""
    wal_sender_timeout_s: float | None = Field(default=None, gt=0)
    """Override the server's wal_sender_timeout for pg2kafka's replication connection
    (seconds; unset = the server's). Must stay above status_interval_s."""
    heartbeat_interval_s: float = Field(default=30.0, ge=0)
    """Seconds between heartbeat messages written into this database's WAL, so the slot
    advances even when nothing published changes (idle or fully filtered). 0 = off."""
    standby_poll_s: float = Field(default=1.0, gt=0, le=60)
    """High availability: any number of pg2kafka processes may run for one slot; the one
    holding a Postgres advisory lock streams, the others check every standby_poll_s."""
    slot_busy_grace_s: float = Field(default=30.0, ge=0)
    """A leader that finds the slot streamed by someone else waits this long (a dead
    leader's walsender takes a moment to go), then stops: another consumer owns it."""
    no_identity: Literal["emit", "skip"] = "emit"
    """Changes to tables without replica identity columns: emit them with an empty key, or
    skip them (counted in walcast_pg2kafka_skipped_no_identity_total)."""
    invalid_text: Literal["database", "replace"] = "database"
    """Text that is not UTF-8 (a SQL_ASCII database, whose bytes have no encoding; other
    encodings are converted to UTF-8 by the server): decoded as Latin-1, byte for byte
    ("database"), or with U+FFFD for what does not decode ("replace"); counted in
    walcast_pg2kafka_undecodable_values_total, never a stop."""

    @model_validator(mode="after")
    def _timeouts(self) -> ReplicationSettings:
        if self.wal_sender_timeout_s is not None and (
            self.wal_sender_timeout_s <= 2 * self.status_interval_s
        ):
            raise ValueError("wal_sender_timeout_s must exceed twice status_interval_s")
        return self

    _names = field_validator("slot", "publication")(lambda v: plain_name(v))


class FilterSettings(Section):
    """Which tables are streamed: ``schema.table`` patterns, ``*`` a wildcard.

    The publication lists the matching tables (never ``FOR ALL TABLES``) and the DDL
    trigger adds matching tables as they are created or gain a replica identity.
    ``keyless_tables``: what happens to a matching table without a replica identity (no
    primary key). ``inserts`` (the default): it joins a second publication,
    :func:`inserts_publication` of the main one, that publishes only INSERT and TRUNCATE —
    its inserts stream as ``append_only`` rows, its truncates as truncates, and the
    application's UPDATE and DELETE on it work but are not streamed. ``skip``: left out
    (Postgres would refuse the application's UPDATE and DELETE on it if it were in a
    publication publishing them; init reports it, the service logs and counts it).
    ``full_identity``: made ``REPLICA IDENTITY FULL`` and published (every update and
    delete then logs the whole old row). See docs/pg2kafka.md, "Tables without a key".
    """

    include: list[str] = Field(default_factory=lambda: ["*.*"], min_length=1)
    """Tables to stream, as `schema.table` patterns (`*` a wildcard)."""
    exclude: list[str] = Field(default_factory=list)
    """Tables left out although `include` matches them (patterns as there)."""
    keyless_tables: Literal["inserts", "skip", "full_identity"] = "inserts"
    """A matching table without a primary key or replica identity: `inserts` (in a
    second, insert-and-truncate publication `<publication>_ins`: its inserts stream as
    `append_only` rows, the application's UPDATE and DELETE work but are not
    streamed), `skip` (left out) or `full_identity` (made `REPLICA IDENTITY FULL` and
    published whole) ([Tables without a key](#tables-without-a-key))."""

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for pattern in v:
            split_pattern(pattern)
        return v

    @property
    def all_tables(self) -> bool:
        return self.include == ["*.*"] and not self.exclude


_TEMPLATE_FIELDS = {"db", "schema", "table"}


def _check_template(template: str) -> str:
    names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    unknown = names - _TEMPLATE_FIELDS
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {sorted(unknown)}; use {{db}}, {{schema}}, {{table}}"
        )
    return template


class ProducerSettings(Section):
    """The Kafka side: where events go and how they are batched.

    Idempotence and acks=all are not configurable: the checkpoint depends on them.
    """

    topic: str = "walcast.cdc"
    """The CDC topic."""
    topic_template: str | None = None
    """Optional per-table routing: a topic name built from {db}, {schema} and {table} (for
    example "cdc.{schema}.{table}"). Unset: every table goes to `topic`."""
    partition_key: Literal["schema", "table", "primary_key"] = "schema"
    """What keys a record, so what stays in order in one partition: a schema's changes,
    a table's, or a row's (its primary key; table-wide events then go to every
    partition)."""
    linger_ms: int = Field(default=20, ge=0, le=10_000)
    """Producer batching: a batch goes when it holds batch_messages or batch_bytes, or
    after linger_ms — whichever comes first."""
    batch_bytes: int = Field(default=1_048_576, ge=1024)
    """Bytes in one producer batch at most."""
    batch_messages: int = Field(default=10_000, ge=1, le=1_000_000)
    """Records in one producer batch at most."""
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    """How producer batches are compressed."""
    max_inflight_bytes: int = Field(default=100 * 1024 * 1024, ge=1024 * 1024)
    """Memory guard: bytes handed to Kafka but not yet acknowledged. When full, pg2kafka
    stops reading the slot until acks free room (backpressure, nothing dropped)."""
    delivery_timeout_ms: int = Field(default=300_000, ge=1000)
    """How long librdkafka keeps retrying one message before reporting it failed; a failure
    stops the pipeline, which restarts from the last confirmed LSN."""
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=1_000_000)
    """Largest message the producer accepts (librdkafka message.max.bytes); the topic's
    max.message.bytes must allow it too. 1 MB rows plus their envelope need headroom."""
    create_topic: bool = False
    """Create the topic(s) at `init` and start when missing."""
    format: Literal["walcast", "debezium"] = "walcast"
    """The records' shape: walcast's change event (docs/events.md) or Debezium's envelope
    (the ``debezium`` section)."""
    encoding: Literal["json", "avro"] = "json"
    """How records are written: JSON, or Avro in the Confluent wire format with the schemas
    in a registry (the schema_registry section; docs/events.md, "Avro")."""
    source_topic: str = Field(default="walcast.sources", min_length=1, max_length=249)
    """walcast's own compacted topic (created when missing, one partition): per stream
    (keyed by `topic`) the source it carries, its epoch and how far it got — how
    pg2kafka tells a restored or promoted database from the one it streamed
    (docs/snapshots.md, "A different source")."""
    topic_partitions: int = Field(default=6, ge=1)
    """Partitions of a topic pg2kafka creates."""
    topic_replication_factor: int = Field(default=1, ge=1)
    """Replication factor of a topic pg2kafka creates."""

    @field_validator("topic_template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        return None if v is None else _check_template(v)


class DebeziumSettings(Section):
    """``producer.format: debezium``: records shaped as the Debezium PostgreSQL connector
    writes them through Kafka Connect's JSON converter (docs/events.md, "The Debezium
    format"): one topic per table, ``<topic_prefix>.<schema>.<table>``, keyed by the
    primary key's struct."""

    topic_prefix: str = Field(default="walcast", min_length=1, max_length=200)
    """Debezium's topic.prefix: the first part of every topic and schema name."""
    schemas: bool = True
    """The JSON converter's schemas.enable: {"schema", "payload"} records, or bare
    payloads."""
    tombstones: bool = True
    """Debezium's tombstones.on.delete: a delete is followed by a record with the same key
    and no value, so a compacted topic forgets the row."""
    verify_marks: bool = True
    """When a sink's ``verify`` asks for a marker, write it into the table's topic: a record
    with ``op: m``, no row images and the verification's id in ``source.walcast_mark``, on
    every partition (docs/events.md). Off: no marker is written, and ``verify`` of a sink
    of these topics waits for one in vain — for topics also read by consumers that cannot
    skip a record they do not know."""

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", v):
            raise ValueError(
                f"{v!r}: a topic prefix is letters, digits, '.', '_' and '-' (Kafka's topic"
                " characters)"
            )
        return v


class DdlSettings(Section):
    """DDL events (``op: ddl``): what of the captured statement text they carry."""

    scrub_secrets: bool = True
    """The statement is current_query(): everything the client sent at once, so an ALTER
    TABLE may carry an ALTER ROLE ... PASSWORD '...' sent with it. On: the literals of
    PASSWORD clauses, secret OPTIONS (password '...') and CONNECTION '...' become '***'
    (services/pg2kafka/ddl_secrets.py). Off: the statement verbatim."""


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class SnapshotSettings(Section):
    """Snapshots: the rows tables already hold, as ``op: read`` events (docs/snapshots.md).

    ``mode``: ``initial`` (default): when pg2kafka finds no slot it creates one with an
    exported snapshot and, before streaming, brings every published table's rows across
    (resumed after a restart, at the next unfinished chunk); a slot that had to be
    created again (dropped, torn down) is snapshotted again. ``initial_only``: the same,
    then the slot is dropped and the service stops (a one-off copy). ``never``: ``init``
    creates the slot and only changes made after it are streamed.
    """

    mode: Literal["initial", "never", "initial_only"] = "initial"
    """With no slot yet: `initial` (create it with an exported snapshot, read every
    published table, then stream), `initial_only` (the same, then drop the slot and
    stop: a one-off copy) or `never` (`init` creates the slot; changes only)."""
    workers: int = Field(
        default_factory=_default_workers,
        ge=1,
        le=64,
        json_schema_extra={"doc_default": "the cores, at most 4"},
    )
    """Readers working at once, across tables and within one (default: the cores, at most
    4)."""
    chunk_pages: int = Field(default=4096, ge=1)
    """Heap pages per chunk (8 kB each): the unit of progress, of resumption and of work
    shared between readers. 4096 pages = 32 MB of table."""
    chunk_rows: int = Field(default=10_000, ge=1, le=1_000_000)
    """Rows per chunk of an incremental snapshot (a key range): held in memory between the
    chunk's watermarks, so it bounds what one reader holds."""
    automatic: bool = True
    """Snapshot a table by itself when it joins the publication with rows already in it (it
    gained a primary key or replica identity, was created from a query, or the filters
    grew): requests the DDL trigger and init write are taken, else declined."""
    max_rows_per_s: float | None = Field(default=None, gt=0)
    """Upper bound on rows read per second, all readers together (unset: as fast as Kafka
    acknowledges, within the memory guard)."""
    progress_interval_s: float = Field(default=10.0, gt=0)
    """How often the run log and the metrics show progress."""


class SubscriptionSettings(Section):
    """The subscription events stream: _walcast.events rows of ``stream_id`` to ``topic``.

    It has its own slot and publication (a row filter on stream_id), separate from the
    CDC stream, so the two never hold each other's WAL.
    """

    enabled: bool = False
    """Also stream `_walcast.events` of `stream_id` ([subscriptions.md](subscriptions.md))."""
    stream_id: int = Field(default=1, ge=1)
    """The events stream this process carries."""
    slot: str = "walcast_events"
    """The events stream's own slot (never the CDC slot: neither holds the other's WAL)."""
    publication: str = "walcast_events"
    """The events stream's publication (a row filter on `stream_id`)."""
    topic: str = "walcast.events"
    """The topic events go to."""
    key_field: str | None = None
    """Kafka key: this payload field (dotted path, e.g. "group_id"), when present; else the
    subscription key (tg_name)."""
    premake_days: int = Field(default=7, ge=0, le=366)
    """Daily partitions of `_walcast.events` made ahead."""
    retention_days: int = Field(default=7, ge=1, le=3660)
    """Days of daily partitions kept."""
    maintenance_interval_s: float = Field(default=3600.0, gt=0)
    """Seconds between partition maintenance runs."""
    failover_after_s: float = Field(default=30.0, gt=0)
    """Failover: no acknowledgement for this long with events waiting means Kafka is
    unavailable; events are then queued in the table (WAL released) and replayed once a
    probe every probe_interval_s finds Kafka again."""
    probe_interval_s: float = Field(default=5.0, gt=0)
    """Seconds between probes for Kafka while events are queued."""
    replay_batch: int = Field(default=50_000, ge=1)
    """Queued events per replay batch (each acknowledged as a whole)."""
    snapshot_interval_s: float = Field(default=5.0, gt=0)
    """Invalidated-slot recovery: how often a delivered-snapshot candidate is taken. The
    stored snapshot trails delivery by about this much; after an invalidation, events
    delivered within that window are sent again (at least once), none is lost."""

    _names = field_validator("slot", "publication")(lambda v: plain_name(v))


class TransformRule(Section):
    """One column rule (docs/pg2kafka.md, "Transformers"): ``column`` is
    ``schema.table.column`` with ``*`` wildcards in any part; the first rule that matches
    a column is the one applied to it. ``action`` and its parameters:

    * ``drop``: the column is left out of rows, ``old`` images, ``types`` and DDL events;
    * ``mask``: ``keep`` characters stay (at the ``keep_from`` end, never more than half
      the value), every other one becomes ``mask_char``;
    * ``hash``: keyed HMAC-SHA256 (``transforms.hash_key``) as 64 hex digits: equal
      inputs give equal outputs, so joins still work; the one action allowed on key columns;
    * ``redact``: the constant ``value``;
    * ``truncate``: the first ``length`` characters;
    * ``null``: NULL;
    * ``fake``: a value of the same ``kind`` (``email``, ``phone``) derived from the input
      through the hash key: the same input always gives the same fake.

    Rewritten values (all but ``drop`` and ``null``) are text; the event's ``types`` says
    so. NULL stays NULL, an unchanged TOAST value stays unchanged.
    """

    column: str
    """`schema.table.column`, `*` a wildcard in any part."""
    action: Literal["drop", "mask", "hash", "redact", "truncate", "null", "fake"]
    """What the rule does to the column's values ([Transformers](#transformers))."""
    keep: int = Field(default=0, ge=0)
    """`mask`: characters kept (never more than half the value)."""
    keep_from: Literal["start", "end"] = "end"
    """`mask`: the end the kept characters are at."""
    mask_char: str = Field(default="*", min_length=1, max_length=1)
    """`mask`: the character that replaces the others."""
    value: str = "REDACTED"
    """`redact`: the constant written instead."""
    length: int | None = Field(default=None, ge=0)
    """`truncate`: characters kept (required by it)."""
    kind: Literal["email", "phone"] | None = None
    """`fake`: what kind of value is made (required by it)."""

    @field_validator("column")
    @classmethod
    def _column(cls, v: str) -> str:
        parts = v.split(".")
        if len(parts) != 3 or not all(parts):
            raise ValueError(
                f"{v!r}: a rule's column is schema.table.column (with * wildcards), such as"
                " public.users.email or *.*.ssn"
            )
        return v

    @model_validator(mode="after")
    def _parameters(self) -> TransformRule:
        given = self.model_fields_set
        allowed = {
            "mask": {"keep", "keep_from", "mask_char"},
            "redact": {"value"},
            "truncate": {"length"},
            "fake": {"kind"},
        }.get(self.action, set())
        stray = given - allowed - {"column", "action"}
        if stray:
            raise ValueError(
                f"rule for {self.column}: {sorted(stray)} do(es) not apply to action"
                f" {self.action!r}" + (f" (it takes {sorted(allowed)})" if allowed else "")
            )
        if self.action == "truncate" and self.length is None:
            raise ValueError(f"rule for {self.column}: action truncate needs length")
        if self.action == "fake" and self.kind is None:
            raise ValueError(f"rule for {self.column}: action fake needs kind (email, phone)")
        return self


class TransformSettings(Section):
    """Column rules applied in pg2kafka, before anything reaches Kafka: to change events,
    snapshot rows, ``old`` images, keys, DDL events' column lists and subscription
    payloads' ``new`` / ``old`` (docs/pg2kafka.md, "Transformers")."""

    rules: list[TransformRule] = Field(default_factory=list)
    """Column rules, the first match applying ([Transformers](#transformers)); JSON list
    in the environment."""
    hash_key: SecretStr | None = None
    """The HMAC key of ``hash`` and ``fake`` (at least 16 characters). Changing it changes
    every hashed value: sinks then hold two spellings of one input."""

    @model_validator(mode="after")
    def _key(self) -> TransformSettings:
        keyed = [r.column for r in self.rules if r.action in ("hash", "fake")]
        if keyed and self.hash_key is None:
            raise ValueError(
                f"transforms.hash_key is needed by the hash / fake rules for {keyed}: set"
                " PG2KAFKA_TRANSFORMS__HASH_KEY (at least 16 characters, kept secret)"
            )
        if self.hash_key is not None and len(self.hash_key.get_secret_value()) < 16:
            raise ValueError("transforms.hash_key must be at least 16 characters")
        return self


class Pg2KafkaSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="PG2KAFKA_")

    postgres: PostgresSettings = PostgresSettings()
    kafka: KafkaSettings = KafkaSettings()
    replication: ReplicationSettings = ReplicationSettings()
    filters: FilterSettings = FilterSettings()
    producer: ProducerSettings = ProducerSettings()
    debezium: DebeziumSettings = DebeziumSettings()
    schema_registry: SchemaRegistrySettings = SchemaRegistrySettings()
    ddl: DdlSettings = DdlSettings()
    snapshot: SnapshotSettings = SnapshotSettings()
    subscriptions: SubscriptionSettings = SubscriptionSettings()
    transforms: TransformSettings = TransformSettings()
    http: HttpSettings = HttpSettings(port=9187)

    @model_validator(mode="after")
    def _inserts_publication(self) -> Pg2KafkaSettings:
        """Under ``filters.keyless_tables=inserts`` the insert-only publication's name
        must be a Postgres name (63 bytes; a longer one would be cut and could name
        another publication) and must not be the subscription stream's."""
        if self.filters.keyless_tables != "inserts":
            return self
        name = inserts_publication(self.replication.publication)
        if len(name) > 63:
            raise ValueError(
                f"filters.keyless_tables=inserts needs a second publication named"
                f" {name!r}, longer than Postgres's 63 bytes: shorten"
                f" replication.publication to at most {63 - len(INSERTS_SUFFIX)} characters,"
                " or set filters.keyless_tables=skip or full_identity"
            )
        if self.subscriptions.enabled and name == self.subscriptions.publication:
            raise ValueError(
                f"subscriptions.publication {name!r} is the name of the insert-only"
                " publication of replication.publication (filters.keyless_tables=inserts):"
                " choose another name"
            )
        return self

    @model_validator(mode="after")
    def _avro_encoding(self) -> Pg2KafkaSettings:
        """What the Avro encoding needs, and what it does not cover yet, at start-up."""
        if self.producer.encoding != "avro":
            return self
        if self.schema_registry.url is None:
            raise ValueError("producer.encoding=avro needs schema_registry.url")
        template = self.producer.topic_template or ""
        per_table = "{table}" in template or self.producer.format == "debezium"
        if self.schema_registry.subject_name_strategy == "topic" and not per_table:
            raise ValueError(
                "schema_registry.subject_name_strategy=topic keeps one schema per topic, but"
                " this topic carries several tables: set subject_name_strategy=topic_record"
                " (or record), or a producer.topic_template with {table}"
            )
        return self

    @model_validator(mode="after")
    def _debezium_format(self) -> Pg2KafkaSettings:
        """What the Debezium format does not cover yet must be refused at start-up, not
        written in walcast's shape into Debezium's topics."""
        if self.producer.format != "debezium":
            return self
        if self.producer.topic_template is not None:
            raise ValueError(
                "producer.topic_template does not apply to producer.format=debezium: its"
                " topics are <debezium.topic_prefix>.<schema>.<table>; unset the template"
            )
        return self
