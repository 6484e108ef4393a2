"""A producer restart redelivers the stream from its last confirmed position: rows from
before a table was dropped and created again arrive after the new table's changes. An
old row of a key must never complete a newer change that left a TOAST value unchanged —
the composition suite's seed 39 (a recreated table's row lost its TOAST value in the
target: the batch had filled the update from the redelivered insert of the dropped
table's row)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.conftest import HarnessFactory, difference
from tests.integration.kafka2postgres.conftest import ReplicaFactory, table_rows

BIG = "(SELECT string_agg(md5(random()::text || g::text), '') FROM generate_series(1, 300) g)"
"""9,600 random hex characters: stored out of line (TOASTed) even compressed."""


def records(bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic``, partition by partition, in offset order."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-copy",
                  "enable.auto.commit": False})  # fmt: skip
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        out: list[Any] = []
        for p in parts:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            c.assign([TopicPartition(topic, p, low)])
            while high > low and (not out or out[-1].partition() != p or
                                  out[-1].offset() < high - 1):  # fmt: skip
                msg = c.poll(5)
                assert msg is not None, f"partition {p}: no record up to offset {high - 1}"
                if not msg.error():
                    out.append(msg)
        return out
    finally:
        c.close()


def redeliver_from(h: Any, table: str) -> None:
    """Produce again every record from ``table``'s first insert on, each to its partition:
    what pg2kafka sends after a restart from a position just before that insert."""
    topic, bootstrap = h.settings.producer.topic, h.settings.kafka.bootstrap_servers
    stream = records(bootstrap, topic)
    mark = f'"table":"{table}"'.encode()
    first = next(i for i, m in enumerate(stream)
                 if b'"op":"insert"' in m.value() and mark in m.value())  # fmt: skip
    p = Producer({"bootstrap.servers": bootstrap})
    for m in stream[first:]:
        p.produce(topic, m.value(), m.key(), partition=m.partition(), headers=m.headers())
    assert p.flush(30) == 0


def partially_updated(table: str) -> Any:
    """Whether the update that left the TOAST value out (the last change) came."""
    return lambda seen: any(
        e["op"] == "update" and e["table"] == table and e.get("unchanged_toast") for e in seen
    )


def test_a_redelivered_older_row_never_completes_a_newer_change_that_lacks_a_toast_value(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    h = make_harness(producer={"partition_key": "schema"})  # one partition: one order
    suffix = h.settings.replication.slot[-8:]
    stale, again = f"stale_{suffix}", f"again_{suffix}"
    h.start()
    # 1. a row from before an update of the TOAST value that an earlier batch applied
    h.sql(f"CREATE TABLE {stale} (id int PRIMARY KEY, n int, big text)")
    h.sql(f"INSERT INTO {stale} SELECT g, 1, {BIG} FROM generate_series(1, 2) g")
    h.sql(f"UPDATE {stale} SET big = {BIG}")
    h.sql(f"CREATE TABLE {stale}_barrier (id int PRIMARY KEY)")  # a schema change: a barrier
    h.sql(f"UPDATE {stale} SET n = n + 1")  # the TOAST value unchanged: not in the events
    h.events(partially_updated(stale))
    redeliver_from(h, stale)
    # 2. a row of the table before it was dropped and created again
    h.sql(f"CREATE TABLE {again} (id int PRIMARY KEY, n int, big text)")
    h.sql(f"INSERT INTO {again} VALUES (1, 1, NULL), (2, 1, NULL)")
    h.sql(f"DROP TABLE {again}")
    h.sql(f"CREATE TABLE {again} (id int PRIMARY KEY, n int, big text)")
    h.sql(f"INSERT INTO {again} SELECT g, 7, {BIG} FROM generate_series(1, 2) g")
    h.sql(f"CREATE TABLE {again}_barrier (id int PRIMARY KEY)")
    h.sql(f"UPDATE {again} SET n = n + 1")
    h.events(partially_updated(again))
    redeliver_from(h, again)
    r = make_replica(h.settings.producer.topic).start()
    for t in (stale, again):
        r.wait_equal(h.dsn, f"public.{t}", "id")
        want, got = table_rows(h.dsn, f"public.{t}", "id"), table_rows(r.dsn, f"public.{t}", "id")
        assert difference(want, got) == ([], [], [])
        toasted = f"SELECT count(*) FROM public.{t} WHERE length(big) = 9600"
        assert r.sql(toasted) == h.sql(toasted) == [(2,)]
