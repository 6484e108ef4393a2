"""pg2kafka's output seam: what each output format is, how an event's value is encoded,
and the reference that stands for a change too large for its topic — decided here, once
per producer, from the settings; the stream, the initial snapshot and incremental
snapshots ask this module instead of testing ``producer.format`` or ``producer.encoding``
themselves (``tests/unit/pg2kafka/test_output_seam.py`` greps for such tests).

Formats (``producer.format``):

- ``walcast``: walcast's change events (docs/events.md), truncates, schema changes and
  snapshot markers in-stream, incremental snapshots, one topic or a template;
- ``debezium``: the rows as the Debezium connector's records (Kafka Connect envelopes,
  :mod:`services.pg2kafka.debezium_format`), a topic per table, no table-wide events,
  initial snapshots only.

Encodings (``producer.encoding``) of walcast's events: ``json`` (the bytes Postgres writes
itself may be the value, on the initial snapshot's fast path) or ``avro`` (per-table
schemas in the registry, :mod:`shared.avro`). The Debezium format encodes its own records
(:func:`connect_encoder`).

The settings model validates what a format does not cover yet (its own start-up check);
everything else asks :func:`output_format`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from services.pg2kafka.replication import DEBEZIUM_SESSION_OPTIONS
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.avro import ConnectRegistryEncoder, RegistryEncoder, Shape

# Fields a reference leaves out: the rows (and which of their values were unchanged).
_ROWS = frozenset({"new", "old", "unchanged_toast"})


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
    incremental_snapshots: bool
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
        "walcast", "", connect_records=False, table_wide_events=True,
        incremental_snapshots=True, per_table_topics=False, partitioner=None,
        references_oversized=True,
    ),
    "debezium": OutputFormat(
        "debezium", DEBEZIUM_SESSION_OPTIONS, connect_records=True, table_wide_events=False,
        incremental_snapshots=False, per_table_topics=True,
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
