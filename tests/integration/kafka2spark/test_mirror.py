"""kafka2spark against real Kafka, Spark and Delta, fed by pg2kafka from real Postgres:
each Delta mirror equals its table after a mixed workload and DDL, read back with an
independent reader (the ``deltalake`` package); replays change nothing; bad records go to
the quarantine."""

from __future__ import annotations

import random
import shutil
import string
from datetime import UTC
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from services.kafka2spark import admin as spark_admin
from services.kafka2spark.app import build
from services.kafka2spark.names import postgres_name
from shared.errors import PermanentError
from shared.kafka import ensure_topic
from tests.integration.conftest import Harness, HarnessFactory, data
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2spark.conftest import MirrorFactory, wait_for

COLUMNS = "id, name, price::text, active, doc::text, big, ts, op"


def pg_rows(h: Harness, table: str, columns: str = COLUMNS) -> dict[int, dict[str, Any]]:
    """The table's rows by id, values as the mirror holds them (numeric as exact text,
    jsonb as JSON, timestamptz as a UTC datetime)."""
    names = [c.split("::")[0].strip() for c in columns.split(",")]
    out: dict[int, dict[str, Any]] = {}
    for r in h.sql(f"SELECT {columns} FROM {table}"):
        row = dict(zip(names, r, strict=True))
        out[row["id"]] = _normal(row)
    return out


def delta_rows(path: Path) -> dict[int, dict[str, Any]]:
    """The mirror read by delta-rs, not Spark: proof the table is valid for other engines."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    own = ("_walcast_lsn", "_walcast_hash", "_walcast_xid")
    return {r["id"]: _normal({k: v for k, v in r.items() if k not in own}) for r in rows}


def _normal(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    if out.get("doc") is not None:
        out["doc"] = orjson.loads(out["doc"])
    if out.get("ts") is not None:
        out["ts"] = out["ts"].astimezone(UTC)
    return out


def big_text(n: int = 20000) -> str:
    return "".join(random.choices(string.ascii_letters, k=n))


def make_table(h: Harness) -> str:
    table = f"k2d_{h.settings.replication.slot[-8:]}"
    h.sql(
        f"CREATE TABLE {table} (id int PRIMARY KEY, name text, price numeric(12,2),"
        " active bool, doc jsonb, big text, ts timestamptz,"
        " op text)"  # a name the mirror's own working columns must not collide with
    )
    return table


def committed(group: str, topic: str, bootstrap: dict[str, Any]) -> tuple[int, int]:
    """(sum of the group's committed offsets, sum of the end offsets) over the topic."""
    c = Consumer({**bootstrap, "group.id": group})
    try:
        parts = [
            TopicPartition(topic, p)
            for p in c.list_topics(topic, timeout=10).topics[topic].partitions
        ]
        done = sum(max(tp.offset, 0) for tp in c.committed(parts, timeout=10))
        end = sum(c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts)
        return done, end
    finally:
        c.close()


def test_mirror_equals_the_table_through_a_mixed_workload_and_ddl(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    h = make_harness()
    table = make_table(h)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    h.sql(
        f"INSERT INTO {table} SELECT g, 'n' || g, g * 1.25, g % 2 = 0,"
        " jsonb_build_object('g', g, 'tags', jsonb_build_array('a', g)), NULL,"
        " '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 minute'"
        " FROM generate_series(1, 200) g"
    )
    h.sql(f"UPDATE {table} SET big = %s WHERE id <= 5", [big_text()])
    h.sql(f"UPDATE {table} SET name = name || '!' WHERE id % 3 = 0")  # big unchanged: TOAST
    h.sql(f"DELETE FROM {table} WHERE id % 10 = 0")
    h.sql(f"UPDATE {table} SET id = id + 1000 WHERE id = 7")  # key change
    h.sql(f"UPDATE {table} SET price = 99.99, active = NOT active WHERE id BETWEEN 100 AND 150")
    h.events(lambda seen: len(data(h.table_events(table), table)) >= 200 + 5 + 66 + 20 + 2 + 45)
    assert any(e.get("unchanged_toast") for e in h.table_events(table))

    m.run()
    path = m.path(table)
    assert delta_rows(path) == pg_rows(h, table)
    assert delta_rows(path)[3]["big"] is not None  # kept through a TOAST-less update
    group, topic = m.settings.source.group_id, h.settings.producer.topic
    done, end = committed(group, topic, m.settings.kafka.client_config())
    assert done == end > 0  # lag visible in standard tooling: none

    # DDL between runs and inside one batch: add, fill, rename, drop; then a truncate.
    h.sql(f"ALTER TABLE {table} ADD COLUMN qty int")
    h.sql(f"UPDATE {table} SET qty = id * 2 WHERE id < 50")
    h.sql(f"ALTER TABLE {table} RENAME COLUMN name TO label")
    h.sql(f"UPDATE {table} SET label = label || '?' WHERE id < 20")
    h.sql(f"ALTER TABLE {table} DROP COLUMN active")
    # Events of one table arrive in commit order: the last statement's event means all.
    h.events(lambda seen: any("DROP COLUMN" in str(e.get("ddl")) for e in seen))
    m.run()
    cols = "id, label, price::text, doc::text, big, ts, op, qty"
    assert delta_rows(path) == pg_rows(h, table, cols)
    # The columns as another engine reads them after the rename and the drop: Postgres'
    # names in Postgres' order, and no column mapping (the deltalake reader returns nulls
    # for column-mapped tables, docs/decisions.md), so the values above are the files'.
    mirror = DeltaTable(str(path))
    names = [c.split("::")[0].strip() for c in cols.split(",")]
    own = ("_walcast_lsn", "_walcast_hash", "_walcast_xid")
    assert [n for n in mirror.to_pyarrow_table().column_names if n not in own] == names
    assert [f.name for f in mirror.schema().fields if f.name not in own] == names
    assert "delta.columnMapping.mode" not in mirror.metadata().configuration
    assert mirror.protocol().min_reader_version == 1
    h.sql(f"TRUNCATE {table}")
    h.sql(f"INSERT INTO {table} (id, label, qty) VALUES (1, 'after', 1), (2, 'after', 2)")
    h.events(
        lambda seen: (
            sum(
                1
                for e in h.table_events(table)
                if e.get("new") and e["new"].get("label") == "after"
            )
            >= 2
        )
    )
    m.run()
    assert delta_rows(path) == pg_rows(h, table, cols)
    props = DeltaTable(str(path)).metadata().configuration
    assert int(props["walcast.truncated_lsn"]) > 0  # kept through the rename's rewrite
    assert props["walcast.schema_at"] != "0:0"
    # The changelog holds every change event, partitioned by table and date.
    changelog = DeltaTable(str(m.settings.delta.root / "_changelog"))
    assert changelog.metadata().partition_columns == ["source_table", "commit_date"]
    logged = changelog.to_pyarrow_table().to_pylist()
    assert len([r for r in logged if r["table"] == table]) == len(
        [e for e in h.seen if e.get("table") == table]
    )


def test_a_replayed_batch_changes_nothing(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    h = make_harness()
    table = make_table(h)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    h.sql(
        f"INSERT INTO {table} (id, name, big) SELECT g, 'n' || g, %s FROM generate_series(1, 50) g",
        [big_text()],
    )
    h.sql(f"UPDATE {table} SET name = 'x' WHERE id < 10")  # TOAST unchanged
    h.sql(f"DELETE FROM {table} WHERE id > 45")
    h.sql(f"ALTER TABLE {table} ADD COLUMN b int")
    h.sql(f"UPDATE {table} SET b = id WHERE id < 30")
    h.sql(f"ALTER TABLE {table} ADD COLUMN c int")
    h.sql(f"UPDATE {table} SET c = id WHERE id < 20")
    h.sql(f"ALTER TABLE {table} RENAME COLUMN b TO bb")
    h.sql(f"TRUNCATE {table}")
    h.sql(f"INSERT INTO {table} (id, name, bb, c) VALUES (1, 'again', 1, 1)")
    h.events(
        lambda seen: any(
            e.get("new") and e["new"].get("name") == "again" for e in h.table_events(table)
        )
    )
    first = m.feed(0)
    path = m.path(table)
    cols = COLUMNS + ", bb, c"
    want = pg_rows(h, table, cols)
    assert delta_rows(path) == want
    versions = {
        p: DeltaTable(str(p)).version() for p in (path, m.settings.delta.root / "_changelog")
    }
    again = m.feed(0)  # Spark re-runs an unfinished batch with the same id and records
    assert again.records == first.records
    assert again.schema_changes == []  # every DDL and the truncate were recognised as done
    assert delta_rows(path) == want
    changelog = DeltaTable(str(m.settings.delta.root / "_changelog"))
    assert changelog.version() == versions[m.settings.delta.root / "_changelog"]  # skipped
    assert len(changelog.to_pyarrow_table()) == first.events


def test_bad_records_go_to_the_quarantine_and_the_stream_goes_on(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    h = make_harness()
    table = make_table(h)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    h.sql(f"INSERT INTO {table} (id, name) VALUES (1, 'before')")
    h.events(lambda seen: len(h.table_events(table)) >= 1)
    good = h.table_events(table)[0]
    wrong_type = {
        **good,
        "lsn": good["lsn"] + 1,
        "key": {"id": 2},
        "new": {**good["new"], "id": 2, "ts": "not a time"},
    }
    p = Producer(m.settings.kafka.client_config())
    poison = [
        b"not json at all",
        orjson.dumps({**good, "v": 99}),
        orjson.dumps({k: v for k, v in good.items() if k != "lsn"}),
        orjson.dumps(wrong_type),
    ]
    for value in poison:
        p.produce(h.settings.producer.topic, value, b"poison", partition=0)
    assert p.flush(30) == 0
    h.sql(f"INSERT INTO {table} (id, name) VALUES (3, 'after')")
    # (Not h.events: its reader would choke on the poison.) pg2kafka confirms an LSN
    # only after Kafka acknowledged everything before it.
    lsn = int(h.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
    wait_for(lambda: h.slot_confirmed() >= lsn, "the insert after the poison in Kafka")
    m.run()
    assert delta_rows(m.path(table)) == pg_rows(h, table)
    q = DeltaTable(str(m.settings.delta.root / "_quarantine")).to_pyarrow_table().to_pylist()
    reasons = sorted(r["reason"] for r in q)
    assert len(q) == 4, reasons
    assert {r["value"] for r in q} == set(poison)
    assert all(r["topic"] == h.settings.producer.topic and r["partition"] == 0 for r in q)
    assert any("not a JSON object" in r for r in reasons), reasons
    assert any("unknown event version" in r for r in reasons)
    assert any("'lsn'" in r for r in reasons)
    assert any("does not fit the column types" in r for r in reasons)


def test_status_and_maintain(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, spark: Any, unique_name: str
) -> None:
    # the changelog counted below holds the topic's events: no other test's table in it
    h = make_harness(filters={"include": [f"public.k2d_{unique_name[-8:]}"]})
    table = make_table(h)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    for i in range(3):  # three batches: three small files to compact
        h.sql(
            f"INSERT INTO {table} (id, name)"
            " SELECT g, 'n' FROM generate_series(%s::int, %s::int) g",
            [i * 10 + 1, i * 10 + 10],
        )
        h.events(lambda seen, i=i: len(h.table_events(table)) >= (i + 1) * 10)
        m.run()
    info = spark_admin.status(m.settings)
    assert info["last_batch"] is not None
    assert info["last_batch"]["batch_id"] == 2
    assert info["total_lag"] == 0
    assert all(p["committed"] is not None for p in info["lag"] if p["end"])
    tables = {t["table"]: t for t in info["tables"]}
    assert tables[f"public.{table}"]["rows"] == 30
    assert tables["_changelog"]["rows"] == len([e for e in h.seen if e.get("table") == table])
    before = delta_rows(m.path(table))
    done = {e["table"]: e for e in spark_admin.maintain(m.settings, spark)}
    assert done[f"public.{table}"]["files_removed"] >= 3  # compacted into one
    assert done[f"public.{table}"]["files_added"] == 1
    assert delta_rows(m.path(table)) == before == pg_rows(h, table)


def test_a_truncate_removes_only_rows_older_than_itself_and_keyless_rows_stay_out(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    """Under primary-key partitioning a truncate travels in every partition, and a batch
    may hold rows written after it (other partitions) without it: the truncate arriving
    later must keep them. Changes without key values (sent while the table had no key)
    never become NULL-key rows of the keyed mirror."""
    topic = f"{unique_name}.trunc"
    t = "trunc"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 2, 1)
    try:
        producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})
        producer.produce(topic, change(t, "insert", 50, 2), b"k2", partition=1)
        producer.produce(topic, change(t, "insert", 200, 1), b"k1", partition=1)
        producer.produce(topic, change(t, "insert", 210, 7, keyless=True), b"t", partition=1)
        producer.produce(topic, change(t, "insert", 60, 3), b"k3", partition=0)
        producer.produce(topic, change(t, "truncate", 100), b"t", partition=0)
        producer.flush(10)
        first = m.feed(0, partitions=[1])
        assert first.keyless == {f"public.{t}": 1}
        path = m.path(t)
        assert sorted(delta_ids(path)) == [1, 2]
        m.feed(1, partitions=[0])
        assert delta_ids(path) == [1]  # LSN 200 > the truncate's 100: kept
    finally:
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)


def delta_ids(path: Path) -> list[int | None]:
    return [r["id"] for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()]


def test_odd_columns_case_twins_structured_renames_and_widening(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    """Before: a column name Delta refuses failed the batch and every table stopped (the
    restart replayed the same batch), and case twins ("Name" beside name) held their
    table; a rename was read from the statement text; an int -> bigint change quarantined
    every later row that needed the range."""
    h = make_harness()
    suffix = h.settings.replication.slot[-8:]
    odd, ok, twins = f"odd_{suffix}", f"ok_{suffix}", f"twins_{suffix}"
    h.sql(
        f'CREATE TABLE {odd} (id int PRIMARY KEY, "first name" text, "a,b;c" int,'
        ' "_walcast_lsn" text, "__w_new" int, n int)'
    )
    h.sql(f"CREATE TABLE {ok} (id int PRIMARY KEY, v int)")
    h.sql(f'CREATE TABLE {twins} (id int PRIMARY KEY, "Name" text, name text)')
    h.start()
    h.sql(f"INSERT INTO {odd} VALUES (1, 'Ada', 7, 'mine', 3, 1)")
    h.sql(f"INSERT INTO {ok} VALUES (1, 1)")
    h.sql(f"INSERT INTO {twins} VALUES (1, 'A', 'a')")
    # one migration: a rename in one table, a drop and an add in another
    h.sql(
        f"ALTER TABLE {odd} RENAME COLUMN n TO m;"
        f" ALTER TABLE {ok} DROP COLUMN v; ALTER TABLE {ok} ADD COLUMN w int"
    )
    h.sql(f'ALTER TABLE {odd} ALTER COLUMN "a,b;c" TYPE bigint')
    h.sql(f"""UPDATE {odd} SET "a,b;c" = 9000000000 WHERE id = 1""")
    # twins added and renamed into later: a third twin, a rename onto a twin's name
    h.sql(f'ALTER TABLE {twins} ADD COLUMN "NAME" int')
    h.sql(f'ALTER TABLE {twins} RENAME COLUMN name TO "nAme"')
    h.sql(f"INSERT INTO {twins} VALUES (2, 'B', 'b', 2)")
    h.sql(f'UPDATE {twins} SET "NAME" = 1 WHERE id = 1')
    h.sql(f"INSERT INTO {ok} VALUES (2, 2)")
    h.events(
        lambda seen: (
            len(data(seen, ok)) >= 2 and len(data(seen, odd)) >= 2 and len(data(seen, twins)) >= 3
        )
    )
    m = make_mirror(h.settings.producer.topic)
    m.run()

    verify_columns = ["_walcast_hash", "_walcast_xid"]
    mirror = (
        DeltaTable(str(m.path(odd))).to_pyarrow_table().drop_columns(verify_columns).to_pylist()
    )
    assert mirror == [
        {"id": 1, "first%20name": "Ada", "a%2Cb%3Bc": 9000000000, "%_walcast_lsn": "mine",
         "%__w_new": 3, "m": 1, "_walcast_lsn": mirror[0]["_walcast_lsn"]}
    ]  # fmt: skip
    assert sorted(delta_ids(m.path(ok))) == [1, 2]
    assert {
        r["id"]: (r.get("v"), r.get("w"))
        for r in DeltaTable(str(m.path(ok))).to_pyarrow_table().to_pylist()
    } == {1: (None, None), 2: (None, 2)}
    # the case twins: each has its own column, read back by its Postgres name
    rows = DeltaTable(str(m.path(twins))).to_pyarrow_table().to_pylist()
    assert sorted(
        (
            {
                postgres_name(k): v
                for k, v in r.items()
                if k not in ("_walcast_lsn", *verify_columns)
            }
            for r in rows
        ),
        key=lambda r: r["id"],
    ) == [
        {"id": 1, "Name": "A", "nAme": "a", "NAME": 1},
        {"id": 2, "Name": "B", "nAme": "b", "NAME": 2},
    ]
    assert not any(r.held for r in m.results)
    assert spark_admin.status(m.settings)["held"] == {}


def test_a_mirror_deleted_outside_walcast_is_held_not_recreated_partial(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    """Before: the next change silently created the mirror again, holding only the rows
    changed since. Now the table is held (its changes quarantined) with what to do."""
    h = make_harness()
    t = f"gone_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    h.start()
    h.sql(f"INSERT INTO {t} SELECT g, g FROM generate_series(1, 10) g")
    h.events(lambda seen: len(data(seen, t)) >= 10)
    m = make_mirror(h.settings.producer.topic)
    m.run()
    assert len(delta_ids(m.path(t))) == 10
    shutil.rmtree(m.path(t))  # by someone else
    h.sql(f"UPDATE {t} SET v = 0 WHERE id = 1")
    h.events(lambda seen: len(data(seen, t)) >= 11)
    m.run()
    assert not m.path(t).exists()
    held = spark_admin.status(m.settings)["held"]
    (reason,) = [v["reason"] for k, v in held.items() if k.endswith(f".{t}")]
    assert "deleted outside walcast" in reason


def test_a_recreated_topic_stops_the_job_with_what_to_do(
    make_mirror: MirrorFactory, unique_name: str, spark: SparkSession
) -> None:
    """Before: Spark's fail-on-data-loss stopped kafka2spark with a Spark stack trace,
    and the obvious fix (deleting the checkpoint) duplicated the changelog."""
    topic = f"{unique_name}.again"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    client = AdminClient(config)
    ensure_topic(config, topic, 1, 1)
    producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})
    for i in range(1, 4):
        producer.produce(topic, change("again", "insert", 10 * i, i), str(i).encode())
    producer.flush(10)
    m.run()
    client.delete_topics([topic])[topic].result(30)
    wait_for(lambda: topic not in client.list_topics(timeout=10).topics, "the topic gone")
    ensure_topic(config, topic, 1, 1)
    producer.produce(topic, change("again", "insert", 100, 9), b"9")
    producer.flush(10)
    service = build(m.settings, spark)
    try:
        with pytest.raises(PermanentError, match="offsets went back") as err:
            service._mirror()
        assert "checkpoint" in (err.value.hint or "")
    finally:
        service.committer.close()
        client.delete_topics([topic])[topic].result(30)
