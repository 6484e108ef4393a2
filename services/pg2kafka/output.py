"""pg2kafka's output seam: what each output format is, how an event's value is encoded,
and the reference that stands for a change too large for its topic — decided here, once
per producer, from the settings; the stream, the initial snapshot and incremental
snapshots ask this module instead of testing ``producer.format`` or ``producer.encoding``
themselves (``tests/unit/pg2kafka/test_output_seam.py`` greps for such tests).

Formats (``producer.format``):

- ``walcast``: walcast's change events (docs/events.md), truncates, schema changes and
  snapshot markers in-stream, incremental snapshots, one topic or a template;
- ``debezium``: the rows as the Debezium connector's records (Kafka Connect envelopes,
  :mod:`services.pg2kafka.debezium_format`), a topic per table, no truncates or schema
  changes; initial and incremental snapshots (``r`` records; an incremental snapshot's
  end as an ``m`` record with ``source.walcast_snapshot``).

Encodings (``producer.encoding``) of walcast's events: ``json`` (the bytes Postgres writes
itself may be the value, on the initial snapshot's fast path) or ``avro`` (per-table
schemas in the registry, :mod:`shared.avro`). The Debezium format encodes its own records
(:func:`connect_encoder`).

A record larger than its topic takes follows its format's rule, :class:`Oversized`: one
place for the stream and the snapshots.

The settings model validates what a format does not cover yet (its own start-up check);
everything else asks :func:`output_format`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from services.pg2kafka.replication import DEBEZIUM_SESSION_OPTIONS
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.avro import ConnectRegistryEncoder, RegistryEncoder, Shape
from shared.errors import PermanentError
from shared.logs import SampledLog

log = logging.getLogger(__name__)

# Fields a reference leaves out: the rows (and which of their values were unchanged).
_ROWS = frozenset({"new", "old", "unchanged_toast", "hash"})


@dataclass(frozen=True)
class OutputFormat:
    """The facts of one output format that the rest of pg2kafka acts on."""

    name: str
    # Extra options of the replication session (the text pgoutput sends must be what the
    # format's converters expect).
    session_options: str
    # Rows become Kafka Connect records (Debezium's envelope) instead of walcast events.
    connect_records: bool
    # Truncates, schema changes and snapshot markers are written.
    table_wide_events: bool
    # Records carry the source's epoch (services/pg2kafka/source.py): a sink orders a new
    # source's rows above every row of an old one, whatever their positions.
    source_epochs: bool
    # A topic per table whatever producer.topic says.
    per_table_topics: bool
    # librdkafka's partitioner that places a key where the format's readers expect it
    # (None: the default).
    partitioner: str | None
    # A change too large for its topic travels as a reference without its rows (walcast),
    # or stops the stream with what to fix (Debezium's envelope has no place for one).
    references_oversized: bool


FORMATS: dict[str, OutputFormat] = {
    "walcast": OutputFormat(
        "walcast", "", connect_records=False, table_wide_events=True, source_epochs=True,
        per_table_topics=False, partitioner=None,
        references_oversized=True,
    ),
    "debezium": OutputFormat(
        "debezium", DEBEZIUM_SESSION_OPTIONS, connect_records=True, table_wide_events=False,
        source_epochs=False,
        per_table_topics=True,
        # Kafka Connect's (Java) partitioner: a key lands in the partition Debezium's
        # record of it would (librdkafka's default hashes differently).
        partitioner="murmur2_random", references_oversized=False,
    ),
}  # fmt: skip


def output_format(settings: Pg2KafkaSettings) -> OutputFormat:
    """The format ``producer.format`` names."""
    return FORMATS[settings.producer.format]


class ValueEncoder(Protocol):
    """An event's record value in the producer's encoding. One per producer (the
    stream's, each snapshot reader's); not shared between threads."""

    # Whether the value is the event's JSON, so a snapshot may send the bytes Postgres
    # writes itself (and a marker needs no table shape).
    writes_json: bool

    def encode(self, topic: str, ev: Mapping[str, Any], shape: Shape | None = None) -> bytes:
        """The value of ``ev`` on ``topic``; ``shape`` (columns and key of the table, see
        :meth:`shared.avro.RegistryEncoder.encode`) for an event that carries no types,
        such as a snapshot marker."""
        ...


class JsonValues:
    """walcast's events as JSON (docs/events.md)."""

    writes_json = True

    def encode(self, topic: str, ev: Mapping[str, Any], shape: Shape | None = None) -> bytes:
        return orjson.dumps(ev)


class AvroValues:
    """walcast's events in Avro, one schema per table in the registry (shared/avro.py)."""

    writes_json = False

    def __init__(self, encoder: RegistryEncoder) -> None:
        self.encoder = encoder

    def encode(self, topic: str, ev: Mapping[str, Any], shape: Shape | None = None) -> bytes:
        return self.encoder.encode(topic, ev, shape)


def value_encoder(settings: Pg2KafkaSettings) -> ValueEncoder:
    """The encoder of walcast's events that ``producer.encoding`` names (JSON under the
    Debezium format, whose records encode themselves: only what it never writes would
    use it)."""
    if settings.producer.encoding == "avro" and not output_format(settings).connect_records:
        registry = settings.schema_registry
        return AvroValues(RegistryEncoder(registry.client(), registry.subject_name_strategy))
    return JsonValues()


def connect_encoder(settings: Pg2KafkaSettings) -> ConnectRegistryEncoder | None:
    """The Avro encoder of the Debezium format's records (Confluent's AvroConverter's
    wire format), or None: they are JSON (``producer.encoding=json``) or not written
    (another format)."""
    if not output_format(settings).connect_records or settings.producer.encoding != "avro":
        return None
    registry = settings.schema_registry
    return ConnectRegistryEncoder(registry.client(), registry.subject_name_strategy)


def reference(ev: Mapping[str, Any], size: int) -> dict[str, Any]:
    """What goes in place of a change or a read row larger than its topic takes (it would
    stop the stream for good: Kafka refuses it, and it is first in line again after every
    restart): the same event without its rows, with ``oversized`` = its size; consumers
    dead-letter it with that reason."""
    ref = {k: v for k, v in ev.items() if k not in _ROWS}
    ref["new"] = None
    ref["old"] = None
    ref["oversized"] = size
    return ref


def too_large(what: str, topic: str, size: int, limit: int) -> PermanentError:
    """What stops a producer whose format has no reference for a record too large for its
    topic (Debezium's envelope has no place for one): the operator's fix, rather than a
    loop on a record Kafka refuses."""
    return PermanentError(
        f"{what} is {size} bytes, more than topic {topic} takes ({limit})",
        hint="raise the topic's max.message.bytes (and producer.max_message_bytes), then"
        " restart: pg2kafka resumes where it stopped",
    )


class Oversized:
    """What goes to Kafka in place of a record larger than its topic takes — such a record
    would stop its producer for good (Kafka refuses it, and it is first in line again after
    every restart). The format's rule (:attr:`OutputFormat.references_oversized` says which
    it is), for the stream and every snapshot reader alike: a walcast event travels as its
    :func:`reference` (:meth:`event`), counted by ``counted`` and logged (sampled), and
    consumers dead-letter it; a Debezium record stops the producer with what to fix
    (:meth:`record`). One per producer; not shared between threads."""

    def __init__(self, values: ValueEncoder, counted: Callable[[], None] | None = None) -> None:
        self.values = values
        self.counted = counted
        self._log = SampledLog(log, "oversized changes")

    def event(self, topic: str, ev: Mapping[str, Any], size: int) -> bytes:
        """The value that goes in place of ``ev``, whose value is ``size`` bytes."""
        if self.counted is not None:
            self.counted()
        schema, table = ev.get("schema"), ev.get("table")
        self._log.warning(
            f"{schema}.{table}",
            "a %s of %s.%s (key %.200s, LSN %s) is %d bytes, more than topic %s takes: sent"
            " as a reference without its rows",
            "row read" if ev.get("op") == "read" else "change",
            schema,
            table,
            orjson.dumps(ev.get("key")).decode(),
            ev.get("lsn"),
            size,
            topic,
        )
        return self.values.encode(topic, reference(ev, size))

    @staticmethod
    def record(what: str, topic: str, size: int, limit: int) -> PermanentError:
        """The error that stops a producer of records without a reference (raise it)."""
        return too_large(what, topic, size, limit)
