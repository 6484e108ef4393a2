"""walcast's events in Avro end to end: pg2kafka (``producer.encoding: avro``) registers
each table's schema with a registry — the Confluent-compatible TEST DOUBLE of
tests/schema_registry.py, spoken to over HTTP by confluent-kafka's standard client —
and writes the Confluent wire format; a plain Avro reader (confluent-kafka's own
deserializer, no walcast code) reads the changes back; kafka2search reads the topic
through the registry into an index equal to the table. A column added evolves the
schema (a new registered version); a column's type changed is refused by the registry's
BACKWARD rule and pg2kafka stops saying what to do."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2search.conftest import IndexerFactory, jsonish
from tests.schema_registry import running


def read_avro(
    bootstrap: str, topic: str, url: str, want: int, failed: list[BaseException]
) -> list[dict[str, Any]]:
    """Every record of the topic as confluent-kafka's own Avro deserializer reads it."""
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": url}))
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-avro-reader",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe([topic])
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < want and time.monotonic() < deadline:
            if failed:
                raise failed[0]
            for msg in c.consume(100, 0.5):
                if msg.error() is None:
                    value = msg.value()
                    if value is None:  # a Debezium tombstone
                        continue
                    assert value[0] == 0  # the wire format's magic byte
                    out.append(deserialize(value, SerializationContext(topic, MessageField.VALUE)))
    finally:
        c.close()
    assert len(out) >= want, f"{len(out)} records of {want} in 60s"
    return out


def test_avro_from_pg2kafka_to_the_index(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    table = f"{unique_name}_t"
    with running() as (url, registry):
        h = make_harness(
            producer={"encoding": "avro"},
            schema_registry={"url": url, "subject_name_strategy": "topic_record"},
            snapshot={"mode": "never", "automatic": False},
            filters={"include": [f"public.{table}"]},  # no other test's table in the topic
        )
        topic = h.settings.producer.topic
        h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, name text, amount numeric(10,2),"
              " doc jsonb, tags text[], seen timestamptz)")  # fmt: skip
        h.start()
        h.sql(f"INSERT INTO {table} VALUES (1, 'a', 10.50, '{{\"k\": [1, 2]}}', '{{x,y}}',"
              " '2024-02-29 10:00+00'), (2, 'b', NULL, NULL, NULL, NULL)")  # fmt: skip
        h.sql(f"UPDATE {table} SET name = 'a2', amount = amount + 1 WHERE id = 1")
        h.sql(f"DELETE FROM {table} WHERE id = 2")
        h.sql(f"ALTER TABLE {table} ADD COLUMN note text")
        h.sql(f"INSERT INTO {table} (id, name, note) VALUES (3, 'c', 'added')")
        # the CREATE's and the ALTER's DDL events, two inserts, an update, a delete, an insert
        records = read_avro(h.settings.kafka.bootstrap_servers, topic, url, 7, h.error)
        data = [r for r in records if r["table"] == table and r["op"] != "ddl"]
        assert [r["op"] for r in data] == ["insert", "insert", "update", "delete", "insert"]
        assert data[2]["new"]["amount"] == "11.50"  # numeric: exact, as in the JSON event
        assert json.loads(data[0]["new"]["doc"]) == {"k": [1, 2]}  # the JSON's text
        assert data[0]["new"]["tags"] == ["x", "y"]
        assert data[4]["new"]["note"] == "added"
        subjects = [s for s in registry.subjects if s.startswith(f"{topic}-")]
        assert len(subjects) == 1, subjects
        assert len(registry.subjects[subjects[0]]) == 2  # evolved once, by the DDL

        ix = make_indexer(topic, schema_registry={"url": url}).start()
        want = {str(r[0]): jsonish(r[1]) for r in h.sql(f"SELECT id, to_jsonb(x) FROM {table} x")}

        def equal() -> bool:
            got = ix.docs(table)
            return {k: _norm(v) for k, v in got.items()} == {k: _norm(v) for k, v in want.items()}

        ix.wait(equal, "the index equal to the table")

        # A column's type changed: BACKWARD refuses it; pg2kafka stops with what to do.
        h.sql(f"ALTER TABLE {table} ALTER COLUMN name TYPE int USING length(name)")
        deadline = time.monotonic() + 60
        while not h.error and time.monotonic() < deadline:
            time.sleep(0.2)
        assert h.error, "pg2kafka went on after the registry refused the schema"
        assert "refused the new schema" in str(h.error[0])
        h.error.clear()


def _norm(row: dict[str, Any]) -> dict[str, Any]:
    """to_jsonb's numbers and walcast's exact numeric text compared as numbers; a column
    added after a document was written is absent from it, as null."""
    return {k: float(v) if k == "amount" else v for k, v in row.items() if v is not None}


pytestmark = pytest.mark.timeout(600)


def test_an_avro_snapshot_then_changes_into_the_index(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    """The initial snapshot in Avro: two reader processes, one-page chunks, the start and
    end markers (written with the table's schema), then streamed changes."""
    from services.pg2kafka import admin

    table = f"{unique_name}_s"
    with running() as (url, registry):
        h = make_harness(
            init=False,
            producer={"encoding": "avro"},
            schema_registry={"url": url, "subject_name_strategy": "record"},
            snapshot={"mode": "initial", "automatic": False, "workers": 2, "chunk_pages": 1},
            filters={"include": [f"public.{table}"]},
        )
        h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, n numeric, ok bool)")
        h.sql(f"INSERT INTO {table} SELECT g, 'v' || g, g / 3.0, g % 2 = 0"
              " FROM generate_series(1, 300) g")  # fmt: skip
        admin.init(h.settings)
        h.start()
        ix = make_indexer(h.settings.producer.topic, schema_registry={"url": url}).start()
        ix.wait(lambda: len(ix.docs(table)) == 300, "the snapshot indexed", timeout=120)
        h.sql(f"UPDATE {table} SET v = 'streamed' WHERE id <= 10")
        h.sql(f"DELETE FROM {table} WHERE id > 290")
        want = {
            str(i): {"id": i, "v": v, "n": n, "ok": ok}
            for i, v, n, ok in h.sql(f"SELECT id, v, n::text, ok FROM {table}")
        }
        ix.wait(lambda: ix.docs(table) == want, "the index equal to the table", timeout=90)
        # One subject for the table (record strategy), one version: the markers and the
        # rows of both reader processes and the stream share the schema.
        assert [len(v) for v in registry.subjects.values()] == [1], registry.subjects


def test_debezium_records_in_avro_into_the_index(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    """``format: debezium`` with ``encoding: avro``: keys and values as Confluent's
    AvroConverter writes Debezium's records (subjects <topic>-key / <topic>-value), read
    by a plain Avro deserializer, and by kafka2search (``input_format: debezium``)."""
    table = f"{unique_name}_d"
    prefix = f"{unique_name}_p"
    topic = f"{prefix}.public.{table}"
    with running() as (url, registry):
        h = make_harness(
            producer={"encoding": "avro", "format": "debezium", "create_topic": True,
                      "topic_partitions": 1},
            debezium={"topic_prefix": prefix},
            schema_registry={"url": url},
            snapshot={"mode": "never", "automatic": False},
        )  # fmt: skip
        h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, name text, amount numeric(10,2),"
              " day date)")  # fmt: skip
        h.start()
        h.sql(f"INSERT INTO {table} VALUES (1, 'a', 10.50, '2024-02-29'), (2, 'b', NULL, NULL)")
        h.sql(f"UPDATE {table} SET name = 'a2' WHERE id = 1")
        h.sql(f"DELETE FROM {table} WHERE id = 2")  # a delete and its tombstone
        records = [r for r in read_avro(h.settings.kafka.bootstrap_servers, topic, url, 4,
                                        h.error) if r is not None]  # fmt: skip
        assert [r["op"] for r in records] == ["c", "c", "u", "d"]
        assert records[0]["after"]["amount"] == Decimal("10.50")  # Avro's decimal
        assert sorted(registry.subjects) == [f"{topic}-key", f"{topic}-value"]
        ix = make_indexer(topic, consumer={"input_format": "debezium"},
                          schema_registry={"url": url}).start()  # fmt: skip
        want = {"1": {"id": 1, "name": "a2", "amount": "10.50", "day": "2024-02-29"}}
        ix.wait(lambda: ix.docs(table) == want, "the index equal to the table")
