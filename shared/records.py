"""How a consumer reads one Kafka record: a :class:`RecordDecoder`, chosen once when a
service is wired, never per record.

The consumer loop (:mod:`shared.consumer`) only polls, batches, writes and commits; what a
record *is* — walcast's JSON change event, the same in Avro through a schema registry, a
Debezium connector's record translated into walcast's events, a subscription event —
is decided here, by the decoder the service passes it.
"""

from __future__ import annotations

from typing import Protocol

from confluent_kafka import Message

from shared.avro import RegistryDecoder
from shared.contract.event import EventView, decode
from shared.errors import PermanentError
from shared.formats.debezium_input import InputFormat, is_debezium, translate
from shared.settings import SchemaRegistrySettings


class RecordDecoder(Protocol):
    """One Kafka record → the events it carries, in order (none: a record with nothing to
    apply, such as a Debezium tombstone). Called on the loop's thread, once per record
    read (again after a reconnect: it must not keep state between records).

    Failure: any exception other than walcast's own errors about the service (a
    :class:`~shared.errors.WalcastError` that is no
    :class:`~shared.contract.event.EventDecodeError`: the registry unreachable, a
    setting missing) makes the record *unreadable* — dead-lettered with the reason, never
    a stop (:func:`shared.contract.limits.passes`); those errors retry or stop the
    service as anywhere else."""

    def __call__(self, msg: Message) -> list[EventView]: ...


def change_events(input_format: InputFormat, avro: RegistryDecoder | None) -> RecordDecoder:
    """The decoder of change-event topics (kafka2search; ``consumer.input_format``):
    walcast's events as they are, Debezium records translated into them (``auto``: told
    apart record by record), and either in Avro — the Confluent wire format, a first byte
    of 0, which no JSON record starts with — through ``avro`` (None: such a record means
    ``schema_registry.url`` is missing, a permanent error saying so)."""

    def from_avro(msg: Message, raw: bytes) -> bytes:
        if avro is None:
            raise PermanentError(
                f"{msg.topic()}[{msg.partition()}]@{msg.offset()} is an Avro record (Confluent"
                " wire format) and no schema registry is configured",
                hint="set schema_registry.url to the registry its producer uses",
            )
        return avro.decode(raw)

    def walcast(msg: Message) -> list[EventView]:
        value = msg.value()
        if value and value[0] == 0:
            value = from_avro(msg, value)
        return [decode(value)]

    def debezium(msg: Message, value: bytes | None) -> list[EventView]:
        key = msg.key()
        if key and key[0] == 0 and avro is not None:  # an Avro Debezium key
            key = avro.decode(key)
        return [decode(v) for v in translate(key, value)]

    def any_format(msg: Message) -> list[EventView]:
        value = msg.value()
        if value and value[0] == 0:
            value = from_avro(msg, value)
        if input_format == "auto" and not is_debezium(value):
            return [decode(value)]
        return debezium(msg, value)

    return walcast if input_format == "walcast" else any_format


def configured_change_events(
    input_format: InputFormat, registry: SchemaRegistrySettings
) -> RecordDecoder:
    """:func:`change_events` as a sink's settings ask for it: Avro records through the
    configured registry (none configured: such a record is a permanent error)."""
    avro = RegistryDecoder(registry.client()) if registry.url is not None else None
    return change_events(input_format, avro)
