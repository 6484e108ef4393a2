"""kafka2postgres against real services: pg2kafka streams a source table through Kafka
(three partitions, keyed by primary key: every schema change and truncate reaches each
partition, copies of older ones arrive after newer ones), kafka2postgres writes it into a
target database; both are read with plain SQL and must be equal — rows, columns, types
and key."""

from __future__ import annotations

from typing import Any

from tests.integration.conftest import HarnessFactory, difference
from tests.integration.kafka2postgres.conftest import ReplicaFactory, table_rows, table_schema

BIG = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 300) g)"
"""9,600 random hex characters: stored out of line (TOASTed) even compressed."""


def assert_equal(h: Any, r: Any, qualified: str) -> None:
    want, got = table_rows(h.dsn, qualified, "id"), table_rows(r.dsn, qualified, "id")
    assert difference(want, got) == ([], [], []), f"{qualified}: {len(got)} of {len(want)} rows"
    assert table_schema(r.dsn, qualified) == table_schema(h.dsn, qualified)


def test_a_mixed_workload_with_schema_changes_makes_the_target_equal_to_the_source(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    h = make_harness(producer={"partition_key": "primary_key"})
    t = f"mix_{h.settings.replication.slot[-8:]}"
    other = f"trunc_{h.settings.replication.slot[-8:]}"
    h.start()
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, price numeric(8,2), name varchar(10),"
          " big text, n int, tags text[], at timestamptz)")  # fmt: skip
    h.sql(f"CREATE TABLE {other} (id int PRIMARY KEY, v text)")
    h.sql(f"INSERT INTO {t} SELECT g, g * 1.25, 'n' || g, CASE WHEN g % 10 = 0 THEN {BIG} END,"
          " g, ARRAY['a', NULL, 'c''q'], '2024-01-01'::timestamptz + g * interval '1 hour'"
          " FROM generate_series(1, 300) g")  # fmt: skip
    h.sql(f"INSERT INTO {other} SELECT g, 'before' FROM generate_series(1, 50) g")
    # updates leaving the TOAST value out (unchanged), updates of it, deletes
    h.sql(f"UPDATE {t} SET price = price + 1 WHERE id % 10 = 0")
    h.sql(f"UPDATE {t} SET big = {BIG} WHERE id IN (20, 40)")
    h.sql(f"DELETE FROM {t} WHERE id % 17 = 0")
    # the target starts with this backlog, then the rest arrives while it runs
    r = make_replica(h.settings.producer.topic).start()
    h.sql(f"ALTER TABLE {t} ADD COLUMN note text")
    h.sql(f"UPDATE {t} SET note = 'noted ' || id WHERE id % 3 = 0")
    h.sql(f"ALTER TABLE {t} RENAME COLUMN n TO qty")
    h.sql(f"UPDATE {t} SET qty = qty * 2 WHERE id % 5 = 0")
    h.sql(f"ALTER TABLE {t} ALTER COLUMN qty TYPE bigint")
    h.sql(f"ALTER TABLE {t} ALTER COLUMN name TYPE varchar(20)")
    h.sql(f"ALTER TABLE {t} DROP COLUMN tags")
    h.sql(f"INSERT INTO {t} (id, price, name, qty, note) SELECT g, 0.5, 'late', g, 'x'"
          " FROM generate_series(301, 350) g")  # fmt: skip
    h.sql(f"UPDATE {t} SET price = 99.99 WHERE id % 10 = 0")  # TOAST unchanged again
    h.sql(f"TRUNCATE {other}")
    h.sql(f"INSERT INTO {other} SELECT g, 'after' FROM generate_series(40, 60) g")
    h.sql(f"DELETE FROM {t} WHERE id = 1")
    for q in (f"public.{t}", f"public.{other}"):
        r.wait_equal(h.dsn, q, "id")
        assert_equal(h, r, q)
    # the unchanged TOAST values were kept, never NULLed
    toasted = f"SELECT count(*) FROM public.{t} WHERE length(big) = 9600"
    assert r.sql(toasted) == h.sql(toasted) == [(29,)]
    # what the target holds of the truncated table: only rows after the truncate
    assert {v for (v,) in r.sql(f"SELECT DISTINCT v FROM public.{other}")} == {"after"}


def test_a_restart_reads_the_uncommitted_records_again_and_nothing_moves_back(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    """The whole topic read a second time (a new consumer group: every record
    redelivered, older versions after newer ones) changes nothing: versions guard every
    row, deleted rows stay deleted."""
    h = make_harness(producer={"partition_key": "primary_key"})
    t = f"again_{h.settings.replication.slot[-8:]}"
    h.start()
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    h.sql(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 200) g")
    for i in range(1, 4):
        h.sql(f"UPDATE {t} SET v = {i} WHERE id % {i + 1} = 0")
    h.sql(f"DELETE FROM {t} WHERE id > 150")
    q = f"public.{t}"
    r = make_replica(h.settings.producer.topic).start()
    r.wait_equal(h.dsn, q, "id")
    r.stop()
    again = make_replica(
        h.settings.producer.topic,
        consumer={"group_id": f"{r.settings.consumer.group_id}-again"},
    ).start()
    end = sum(p for p in _ends(h))
    again.wait(lambda: _consumed(again) >= end, "the second group to read the whole topic")
    assert_equal(h, again, q)
    stale = again.sql(
        'SELECT count(*) FROM "_walcast_target"."rows" WHERE deleted'
    )  # the deletes are remembered
    assert stale == [(50,)]


def _ends(h: Any) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": h.settings.kafka.bootstrap_servers, "group.id": "ends"})
    try:
        return [
            c.get_watermark_offsets(TopicPartition(h.settings.producer.topic, p), timeout=10)[1]
            for p in range(3)
        ]
    finally:
        c.close()


def _consumed(r: Any) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": r.settings.kafka.bootstrap_servers,
                  "group.id": r.settings.consumer.group_id})  # fmt: skip
    try:
        topic = r.settings.consumer.topics[0]
        got = c.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
        return sum(max(tp.offset, 0) for tp in got)
    finally:
        c.close()
