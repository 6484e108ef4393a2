"""kafka2postgres reads every format pg2kafka writes, through the shared decoders:
walcast's events in Avro (the Confluent wire format, through the registry double), and
Debezium records in JSON and in Avro. Each run: an initial snapshot, then inserts,
updates around an unchanged TOAST value, deletes and (walcast's format: Debezium's
writes none) a truncate; the target equals the
source by plain SQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import pytest

from services.pg2kafka import admin
from shared.kafka import ensure_topic
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2postgres.conftest import ReplicaFactory
from tests.schema_registry import running

BIG = "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 400) g)"


@contextmanager
def registry(encoding: str) -> Iterator[dict[str, Any]]:
    if encoding == "json":
        with nullcontext():
            yield {}
        return
    with running() as (url, _state):
        yield {"url": url}


@pytest.mark.parametrize(
    ("fmt", "encoding"), [("walcast", "avro"), ("debezium", "json"), ("debezium", "avro")]
)
def test_each_format_makes_the_target_equal_to_the_source(
    make_harness: HarnessFactory, make_replica: ReplicaFactory, unique_name: str, fmt: str,
    encoding: str,
) -> None:  # fmt: skip
    schema = f"fm_{unique_name[-8:]}"
    prefix = f"{unique_name}_p"
    with registry(encoding) as reg:
        producer: dict[str, Any] = {"format": fmt, "encoding": encoding, "create_topic": True,
                                    "topic_partitions": 3}  # fmt: skip
        if fmt == "walcast" and encoding == "avro":
            reg = {**reg, "subject_name_strategy": "record"}
        h = make_harness(
            init=False, producer=producer, debezium={"topic_prefix": prefix},
            schema_registry=reg, filters={"include": [f"{schema}.*"]},
            snapshot={"mode": "initial", "workers": 1},
        )  # fmt: skip
        h.sql(f"CREATE SCHEMA {schema}")
        h.sql(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, v text, n numeric(10,2),"
              " at timestamptz, big text)")  # fmt: skip
        h.sql(f"INSERT INTO {schema}.t SELECT g, 'v' || g, g * 1.25, '2024-01-01'::timestamptz"
              f" + g * interval '1 minute', CASE WHEN g % 50 = 0 THEN {BIG} END"
              " FROM generate_series(1, 300) g")  # fmt: skip
        topic = f"{prefix}.{schema}.t" if fmt == "debezium" else h.settings.producer.topic
        ensure_topic(h.settings.kafka.client_config(), topic, 3, 1)
        admin.init(h.settings)
        h.start()
        r = make_replica(
            topic,
            consumer={"input_format": "debezium" if fmt == "debezium" else "walcast"},
            schema_registry={k: v for k, v in reg.items() if k == "url"},
        ).start()
        q = f"{schema}.t"
        r.wait_equal(h.dsn, q, "id")
        h.sql(f"UPDATE {q} SET v = 'kept' WHERE id % 50 = 0")  # the TOAST value unchanged
        h.sql(f"DELETE FROM {q} WHERE id % 7 = 0")
        h.sql(f"INSERT INTO {q} SELECT g, 'new', 1, now(), NULL FROM generate_series(301, 320) g")
        r.wait_equal(h.dsn, q, "id")
        assert r.sql(f"SELECT count(*) FROM {q} WHERE length(big) > 10000") == [(6,)]
        if fmt == "debezium":
            return  # the format writes no truncates, as the connector's defaults
        h.sql(f"TRUNCATE {q}")
        h.sql(f"INSERT INTO {q} VALUES (1, 'after', 0, now(), NULL)")
        r.wait_equal(h.dsn, q, "id")
