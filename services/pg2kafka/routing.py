"""Where a table's events go: topic and Kafka key (``producer.topic`` /
``topic_template``, ``producer.partition_key``), shared by the stream and the snapshots.
Kept apart from both so a snapshot reader process imports only what it uses."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from services.pg2kafka.settings import Pg2KafkaSettings
from shared.contract.event import ChangeEvent
from shared.naming import KAFKA_TOPIC, table_name

if TYPE_CHECKING:
    from services.pg2kafka.topics import StreamTarget


class Routing:
    """Where a table's events go: the topic (``producer.topic``, or ``topic_template`` per
    table) and the Kafka key (``producer.partition_key``). The stream and the snapshots
    share it, so a table's snapshot rows land in the partitions its changes do (under
    ``primary_key`` keys a row's read and its changes share a partition, in order).
    ``ensure`` is told about a topic before its first event (it learns or creates it)."""

    def __init__(
        self, settings: Pg2KafkaSettings, target: StreamTarget, ensure: Callable[[str], int]
    ) -> None:
        self.template = target.topic_template
        self.topic_name = target.topic
        self.mode = settings.producer.partition_key
        self.ensure = ensure
        self._schema_keys: dict[str, bytes] = {}
        self._topics: dict[tuple[str, str], str] = {}  # (schema, table) -> topic

    def key(self, ev: ChangeEvent) -> bytes:
        if self.mode == "schema":
            schema = ev["schema"]
            key = self._schema_keys.get(schema)
            if key is None:
                key = self._schema_keys[schema] = schema.encode()
            return key
        if self.mode == "table" or not ev.get("key"):
            return table_key(ev["schema"], ev["table"])
        return row_key(ev["schema"], ev["table"], ev["key"])

    def table_wide(
        self, schema: str, table: str, partitions: Callable[[], int]
    ) -> list[tuple[bytes, int]] | None:
        """Where an event that concerns every row of its table goes (a truncate, a schema
        change, a snapshot's start or end marker): under ``primary_key`` keys the table's
        rows are spread over every partition, so to each of them (``partitions()`` asked
        again: rare events), under the table's key — each partition's consumer meets it
        in order with the rows around it (a truncate sent to one partition only would,
        in a consumer reading the others first, remove rows written after it), and sinks
        apply it once, by its LSN. None: like the table's other events, by :meth:`key`."""
        if self.mode != "primary_key":
            return None
        key = table_key(schema, table)
        return [(key, partition) for partition in range(partitions())]

    def topic(self, db: str, schema: str, table: str) -> str:
        if self.template is None:
            return self.topic_name
        where = (schema, table)
        topic = self._topics.get(where)
        if topic is None:
            # Table names may hold what Kafka refuses ("Order Items"): sanitised and made
            # collision-free (shared.naming).
            topic = table_name(self.template, KAFKA_TOPIC, db, schema, table)
            self.ensure(topic)
            self._topics[where] = topic
        return topic


def table_key(schema: str, table: str) -> bytes:
    """The Kafka key of a table's events under ``table`` keys, and of its table-wide
    events under ``primary_key`` keys."""
    return f"{schema}.{table}".encode()


def row_key(schema: str, table: str, key: dict[str, Any] | orjson.Fragment) -> bytes:
    """The Kafka key of a row's events under ``primary_key`` keys. ``key`` as a dict or as
    its JSON (the row encoder's, byte-for-byte what orjson writes for the dict): the same
    row gets the same Kafka key, hence partition, either way."""
    return orjson.dumps({"t": f"{schema}.{table}", "k": key})
