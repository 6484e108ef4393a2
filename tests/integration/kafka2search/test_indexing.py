"""kafka2search against real Kafka + OpenSearch and Elasticsearch, fed by pg2kafka from
real Postgres: the index equals the table after a mixed workload, DDL, truncate."""

from __future__ import annotations

import random
import string
import time
import urllib.request
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from services.kafka2search import admin
from services.kafka2search.indices import forget
from shared.errors import PermanentError
from shared.kafka import ensure_topic
from tests.integration.conftest import HarnessFactory
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2search.conftest import IndexerFactory
from tests.ports import free_port


def expected(h: Any, table: str) -> dict[str, dict[str, Any]]:
    """The table's rows as pg2kafka renders them (numeric as exact text), by id."""
    rows = h.sql(
        f"SELECT id, jsonb_build_object('id', id, 'name', name, 'price', price::text,"
        f" 'active', active, 'doc', doc, 'big', big) FROM {table}"
    )
    return {str(r[0]): r[1] for r in rows}


def big_text(n: int = 20000) -> str:
    return "".join(random.choices(string.ascii_letters, k=n))


def test_the_index_equals_the_table_after_a_mixed_workload(
    make_harness: HarnessFactory, make_indexer: IndexerFactory
) -> None:
    h = make_harness()
    table = f"k2s_{h.settings.replication.slot[-8:]}"
    h.sql(
        f"CREATE TABLE {table} (id int PRIMARY KEY, name text, price numeric(12,2),"
        " active bool, doc jsonb, big text)"
    )
    h.start()
    ix = make_indexer(h.settings.producer.topic).start()
    h.sql(
        f"INSERT INTO {table} SELECT g, 'n' || g, g * 1.25, g % 2 = 0, jsonb_build_object('g', g),"
        " NULL FROM generate_series(1, 300) g"
    )
    h.sql(f"UPDATE {table} SET big = %s WHERE id <= 5", [big_text()])
    h.sql(f"UPDATE {table} SET name = name || '!' WHERE id % 3 = 0")  # big unchanged: TOAST
    h.sql(f"DELETE FROM {table} WHERE id % 10 = 0")
    h.sql(f"UPDATE {table} SET id = id + 1000 WHERE id = 7")  # key change
    h.sql(f"UPDATE {table} SET price = 99.99, active = NOT active WHERE id BETWEEN 100 AND 150")
    want = expected(h, table)
    h.events(lambda seen: len(h.table_events(table)) >= 300 + 5 + 100 + 30 + 2 + 45)
    ix.wait(lambda: ix.docs(table) == want, "the index to equal the table", 90)
    assert ix.docs(table)["3"]["big"] == want["3"]["big"]  # kept through a TOAST-less update
    toast = [e for e in h.table_events(table) if e.get("unchanged_toast")]
    assert toast, "the workload should have produced updates with unchanged TOAST columns"


def mapping_of(ix: Any, table: str) -> dict[str, Any]:
    alias = ix.alias(table)
    if ix.es.resolve_alias(alias) is None:
        return {}
    props, _meta = ix.es.mapping(alias)
    return dict(props)


def test_ddl_and_truncate_follow_the_table(
    make_harness: HarnessFactory, make_indexer: IndexerFactory
) -> None:
    h = make_harness()
    t = f"ddl_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, a text)")
    h.start()
    ix = make_indexer(h.settings.producer.topic, index={"on_drop_table": "delete"}).start()
    h.sql(f"INSERT INTO {t} SELECT g, 'a' || g FROM generate_series(1, 50) g")

    def rows(table: str) -> dict[str, Any]:
        """NULL and absent are the same to a search engine: a column added without a
        default is absent from documents written before it."""
        return {
            str(r[0]): r[1]
            for r in h.sql(f"SELECT id, jsonb_strip_nulls(to_jsonb(x)) FROM {table} x")
        }

    def docs(table: str) -> dict[str, Any]:
        return {i: {k: v for k, v in d.items() if v is not None} for i, d in ix.docs(table).items()}

    ix.wait(lambda: docs(t) == rows(t), "the first rows")
    # A new column is mapped (with its Postgres type) before any data carries it.
    h.sql(f"ALTER TABLE {t} ADD COLUMN c int")
    ix.wait(lambda: mapping_of(ix, t).get("c", {}).get("type") == "integer", "c mapped")
    h.sql(f"UPDATE {t} SET c = id * 2 WHERE id <= 20")
    ix.wait(lambda: docs(t) == rows(t), "c filled")
    # Renaming keeps the data of rows the rename did not touch.
    h.sql(f"ALTER TABLE {t} RENAME COLUMN a TO b")
    ix.wait(lambda: docs(t) == rows(t), "a renamed to b in every document")
    assert mapping_of(ix, t)["b"]["type"] == "text"
    h.sql(f"ALTER TABLE {t} DROP COLUMN c")
    ix.wait(lambda: docs(t) == rows(t), "c gone from every document")
    assert not any("c" in d for d in ix.docs(t).values())
    assert ix.broken_stamps(t) == []  # documents walcast rewrote are stamped anew
    # A second table: its index appears; dropping the table deletes it (on_drop_table).
    t2 = f"{t}_two"
    h.sql(f"CREATE TABLE {t2} (k text, n int, PRIMARY KEY (k, n))")
    h.sql(f"INSERT INTO {t2} VALUES ('x,y', 1), ('x', 2)")
    ix.wait(lambda: set(ix.docs(t2)) == {'["x,y",1]', '["x",2]'}, "composite ids")
    h.sql(f"DROP TABLE {t2}")
    ix.wait(lambda: ix.es.resolve_alias(ix.alias(t2)) is None, "the dropped table's index gone")
    # Truncate empties the index; later rows come back, earlier ones never do.
    h.sql(f"TRUNCATE {t}")
    h.sql(f"INSERT INTO {t} (id, b) VALUES (1000, 'after')")
    ix.wait(lambda: docs(t) == rows(t), "only the rows after the truncate")
    assert set(ix.docs(t)) == {"1000"}


def test_poison_and_refused_documents_go_to_the_dead_letter_topic(
    make_harness: HarnessFactory, make_indexer: IndexerFactory
) -> None:
    h = make_harness()
    t = f"dlq_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, n int)")
    h.start()
    ix = make_indexer(h.settings.producer.topic).start()
    h.sql(f"INSERT INTO {t} VALUES (1, 1)")
    ix.wait(lambda: set(ix.docs(t)) == {"1"}, "the first row")
    # An LSN after the table's creation (older changes are stale for a created table).
    bad_value = {"v": 1, "op": "insert", "db": "walcast", "schema": "public", "table": t,
                 "lsn": 2**62, "key": {"id": 2}, "new": {"id": 2, "n": "not a number"},
                 "types": {"id": "int4", "n": "int4"}}  # fmt: skip
    producer = Producer({"bootstrap.servers": h.settings.kafka.bootstrap_servers})
    poison = [b"not json", orjson.dumps({"v": 99, "op": "insert"}), orjson.dumps(bad_value)]
    for value in poison:
        producer.produce(h.settings.producer.topic, value, b"public", partition=0)
    producer.flush(10)
    h.sql(f"INSERT INTO {t} VALUES (3, 3)")  # the stream goes on past them
    ix.wait(lambda: set(ix.docs(t)) == {"1", "3"}, "the row after the poison")
    letters = ix.dead_letters(3)
    assert sorted(d["value"] for d in letters) == sorted(poison)
    reasons = {d["value"]: d["headers"]["walcast-error"].decode() for d in letters}
    assert "not JSON" in reasons[b"not json"]
    assert "unknown event version 99" in reasons[poison[1]]
    assert "refused by the engine (400)" in reasons[poison[2]]
    assert all(d["headers"]["walcast-source-partition"] == b"0" for d in letters)
    assert all(int(d["headers"]["walcast-source-offset"]) >= 0 for d in letters)


def test_redelivered_and_out_of_order_events_change_nothing(
    make_harness: HarnessFactory, make_indexer: IndexerFactory
) -> None:
    h = make_harness()
    t = f"idem_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    h.start()
    ix = make_indexer(h.settings.producer.topic).start()
    h.sql(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 100) g")
    for _ in range(3):
        h.sql(f"UPDATE {t} SET v = v + 1")
    h.sql(f"DELETE FROM {t} WHERE id > 90")
    rows = {str(r[0]): r[1] for r in h.sql(f"SELECT id, to_jsonb(x) FROM {t} x")}
    ix.wait(lambda: ix.docs(t) == rows, "the index to equal the table")
    events = h.events(lambda seen: len(h.table_events(t)) >= 100 + 300 + 10)
    old = [e for e in events if e.get("table") == t]
    assert ix.service is not None
    metrics = ix.service.loop.metrics
    written = ix.service.indexer.metrics
    before = metrics.records._value.get()
    producer = Producer({"bootstrap.servers": h.settings.kafka.bootstrap_servers})
    for ev in reversed(old):  # every change again, newest first
        producer.produce(h.settings.producer.topic, orjson.dumps(ev), b"public")
    producer.flush(10)
    ix.wait(
        lambda: metrics.records._value.get() >= before + len(old),
        "the redelivered events to be consumed",
    )
    # One old event at a time (no batch to fold it into): the engine's version check
    # refuses each, including the insert of a row deleted since.
    stale = written.stale._value.get()
    firsts = [e for e in old if e["op"] == "insert" and e["key"]["id"] in (1, 2, 3, 95, 96)]
    for n, ev in enumerate(firsts, 1):
        producer.produce(h.settings.producer.topic, orjson.dumps(ev), b"public")
        producer.flush(10)
        ix.wait(
            lambda n=n: metrics.records._value.get() >= before + len(old) + n,
            "the old event to be consumed",
        )
    h.sql(f"INSERT INTO {t} VALUES (500, 5)")  # a barrier: after it, all were written
    rows["500"] = {"id": 500, "v": 5}
    ix.wait(lambda: ix.docs(t) == rows, "the index unchanged but for the new row")
    assert written.stale._value.get() - stale >= len(firsts)


def test_status_replay_and_the_ops_endpoint(
    make_harness: HarnessFactory, make_indexer: IndexerFactory
) -> None:
    h = make_harness()
    t = f"ops_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    h.start()
    port = free_port()
    ix = make_indexer(h.settings.producer.topic, http={"enabled": True, "port": port}).start()
    h.sql(f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 200) g")
    rows = {str(r[0]): r[1] for r in h.sql(f"SELECT id, to_jsonb(x) FROM {t} x")}
    ix.wait(lambda: ix.docs(t) == rows, "the index to equal the table")
    ix.wait(lambda: admin.status(ix.settings)["total_lag"] == 0, "offsets committed")
    info = admin.status(ix.settings)
    assert [p["partition"] for p in info["lag"]] == [0, 1, 2]
    assert {i["alias"]: i["documents"] for i in info["indices"]} == {ix.alias(t): 200}
    assert info["dead_letters"] == 0
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    assert b'walcast_kafka2search_documents_total{action="index"} 200.0' in metrics
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5).status == 200
    # An index lost in the engine comes back with a replay; the group's offsets stay.
    committed = [p["committed"] for p in admin.status(ix.settings)["lag"]]
    ix.stop()
    index = ix.es.resolve_alias(ix.alias(t))
    assert index is not None
    ix.es.delete_index(index)
    assert ix.docs(t) == {}
    # A lost index is not created again, empty, unless the operator says so.
    assert forget(ix.es, ix.alias(t))
    assert admin.replay(ix.settings, from_offset=0) >= 200
    assert ix.docs(t) == rows
    assert [p["committed"] for p in admin.status(ix.settings)["lag"]] == committed


def test_a_truncate_removes_only_rows_older_than_itself(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    """Under primary-key partitioning a truncate travels in every partition; a consumer
    may index rows written after it (from another partition) before it reads its copy.
    Seen with pgbench -i: rows indexed first, then the whole index deleted."""
    topic = f"{unique_name}.trunc"
    t = "trunc"
    ix = make_indexer(topic)
    config = ix.settings.kafka.client_config()
    ensure_topic(config, topic, 2, 1)
    try:
        producer = Producer({"bootstrap.servers": ix.settings.kafka.bootstrap_servers})
        # partition 1: a row older than the truncate (LSN 50), one newer (LSN 200)
        producer.produce(topic, change(t, "insert", 50, 2), b"k2", partition=1)
        producer.produce(topic, change(t, "insert", 200, 1), b"k1", partition=1)
        producer.flush(10)
        ix.start()
        ix.wait(lambda: set(ix.docs(t)) == {"1", "2"}, "partition 1's rows")
        # partition 0: an older row, then the truncate (LSN 100)
        producer.produce(topic, change(t, "insert", 60, 3), b"k3", partition=0)
        producer.produce(topic, change(t, "truncate", 100), b"t", partition=0)
        # and partition 1's copy of the truncate, after its rows
        producer.produce(topic, change(t, "truncate", 100), b"t", partition=1)
        producer.produce(topic, change(t, "insert", 300, 4), b"k4", partition=1)
        producer.flush(10)
        ix.wait(lambda: set(ix.docs(t)) >= {"4"}, "the row after the truncate")
        assert ix.docs(t) == {"1": {"id": 1, "v": 200}, "4": {"id": 4, "v": 300}}
        # an older row arriving late is refused: the engine remembers the versioned delete
        producer.produce(topic, change(t, "insert", 70, 2), b"k2", partition=0)
        producer.produce(topic, change(t, "insert", 400, 5), b"k5", partition=0)
        producer.flush(10)
        ix.wait(lambda: "5" in ix.docs(t), "the last row")
        assert set(ix.docs(t)) == {"1", "4", "5"}
    finally:
        ix.stop()
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)


def test_a_replay_older_than_the_engines_delete_memory_is_refused(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    """A delete is remembered for index.gc_deletes: replaying an older insert after that
    brought the deleted row back. The replay says so instead of doing it."""
    topic = f"{unique_name}.old"
    ix = make_indexer(topic)
    config = ix.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    try:
        producer = Producer({"bootstrap.servers": ix.settings.kafka.bootstrap_servers})
        two_hours_ago = int((time.time() - 7200) * 1000)
        producer.produce(topic, change("old", "insert", 10, 1), b"k1", timestamp=two_hours_ago)
        producer.flush(10)
        with pytest.raises(PermanentError, match=r"2\.0 h old, older than index\.gc_deletes"):
            admin.replay(ix.settings, from_offset=0)
        assert ix.docs("old") == {}
        assert admin.replay(ix.settings, from_offset=0, allow_deleted_to_return=True) == 1
        assert set(ix.docs("old")) == {"1"}
    finally:
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)


def test_an_index_deleted_under_the_service_stops_it_with_what_to_do(
    make_harness: HarnessFactory, make_indexer: IndexerFactory
) -> None:
    """Before: bulk writes to the alias auto-created an index with guessed mappings under
    its name, the service went on with a partial copy, and after a restart creating the
    alias failed for good."""
    h = make_harness()
    t = f"gone_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    h.start()
    ix = make_indexer(h.settings.producer.topic).start()
    h.sql(f"INSERT INTO {t} VALUES (1, 1)")
    ix.wait(lambda: set(ix.docs(t)) == {"1"}, "the first row")
    index = ix.es.resolve_alias(ix.alias(t))
    assert index is not None
    ix.es.delete_index(index)  # by someone else
    h.sql(f"INSERT INTO {t} VALUES (2, 2)")
    deadline = time.monotonic() + 60
    while not ix.error and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ix.error, "the service went on writing into a deleted index"
    (error,) = ix.error
    ix.error.clear()
    assert "deleted outside walcast" in str(error)
    assert "kafka2search forget" in str(error)
    assert not ix.es.exists(f"/{ix.alias(t)}")  # no index guessed under the alias name
