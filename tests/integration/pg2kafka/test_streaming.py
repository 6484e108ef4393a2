"""pg2kafka against the real Postgres and Kafka of the local stack."""

from __future__ import annotations

import base64
import json
import os
import random
import re
import string
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from services.pg2kafka import admin
from services.pg2kafka.app import build
from shared.errors import PermanentError
from shared.kafka import ensure_topic
from tests.conftest import own_tables
from tests.integration.conftest import (
    Harness,
    HarnessFactory,
    data,
    delete_topic,
    make_settings,
)

REPO = Path(__file__).resolve().parents[3]


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def test_operations_and_types(harness: Harness, unique_name: str) -> None:
    t = f"{unique_name}_types"
    harness.sql(f"CREATE TYPE {t}_mood AS ENUM ('happy', 'sad')")
    harness.sql(f"CREATE DOMAIN {t}_pos AS integer CHECK (VALUE > 0)")
    harness.sql(
        f"CREATE TABLE {t} (id bigint PRIMARY KEY, i2 smallint, i4 integer, n numeric(30,10),"
        " f8 float8, ok boolean, j json, jb jsonb, ia int[], ta text[], d date, ts timestamp,"
        f" tz timestamptz, b bytea, u uuid, mood {t}_mood, pos {t}_pos, moods {t}_mood[],"
        " txt text, iv interval)"
    )
    harness.start()
    harness.sql(
        f"INSERT INTO {t} VALUES (1, -2, 3, 12345678901234567890.0123456789, 'NaN', true,"
        """ '{"a":1}', '{"b":[1,2]}', '{1,NULL,3}', '{"x y","z\\"q"}', '2024-02-29',"""
        " '2024-02-29 13:14:15.123456', '2024-02-29 13:14:15.5+02', '\\x00ff10',"
        " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'happy', 7, '{happy,sad}', 'héllo ✓',"
        " '1 day 2 hours')"
    )
    harness.sql(f"INSERT INTO {t} (id) VALUES (2)")
    harness.sql(f"UPDATE {t} SET txt = 'changed', ok = false WHERE id = 1")
    harness.sql(f"DELETE FROM {t} WHERE id = 2")
    harness.sql(f"TRUNCATE {t}")
    evs = harness.events(lambda s: len(data(s, t)) >= 5)
    evs = harness.table_events(t)
    assert [e["op"] for e in evs] == ["insert", "insert", "update", "delete", "truncate"]
    row = evs[0]["new"]
    assert row == {
        "id": 1, "i2": -2, "i4": 3, "n": "12345678901234567890.0123456789", "f8": "NaN",
        "ok": True, "j": {"a": 1}, "jb": {"b": [1, 2]}, "ia": [1, None, 3],
        "ta": ["x y", 'z"q'], "d": "2024-02-29", "ts": "2024-02-29T13:14:15.123456",
        "tz": "2024-02-29T11:14:15.5+00:00", "b": base64.b64encode(b"\x00\xff\x10").decode(),
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "mood": "happy", "pos": 7,
        "moods": ["happy", "sad"], "txt": "héllo ✓", "iv": "P1DT2H",
    }  # fmt: skip
    assert evs[0]["types"]["mood"] == f"{t}_mood"
    assert evs[0]["types"]["n"] == "numeric"
    schema = json.loads((REPO / "shared/schemas/change_event.v1.json").read_text())
    for ev in evs:
        jsonschema.validate(ev, schema)
    nulls = evs[1]["new"]
    assert nulls["id"] == 2
    assert all(v is None for k, v in nulls.items() if k != "id")
    assert evs[2]["new"]["txt"] == "changed"
    assert evs[2]["key"] == {"id": 1}
    assert evs[3]["old"] == {"id": 2}
    assert evs[3]["new"] is None
    assert evs[4]["key"] == {}
    # LSNs: per-change unique and increasing within the stream; commit LSN per transaction
    lsns = [e["lsn"] for e in evs]
    assert lsns == sorted(lsns)
    assert len(set(lsns)) == len(lsns)
    assert all(e["commit_lsn"] >= e["lsn"] for e in evs)
    assert all(e["db"] == "walcast" and e["schema"] == "public" for e in evs)
    # default partition key: the schema name
    keys = {k for k, e in zip(harness.keys, harness.seen, strict=True) if e in evs}
    assert keys == {b"public"}


def test_large_values_and_unchanged_toast(harness: Harness, unique_name: str) -> None:
    t = f"{unique_name}_toast"
    harness.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, note text, big text)")
    big = base64.b64encode(os.urandom(750_000)).decode()  # 1 MB, incompressible: TOASTed
    harness.start()
    harness.sql(f"INSERT INTO {t} VALUES (1, 'a', %s)", [big])
    harness.sql(f"UPDATE {t} SET note = 'b' WHERE id = 1")
    harness.events(lambda s: len(data(s, t)) >= 2)
    ins, upd = harness.table_events(t)
    assert ins["new"]["big"] == big
    assert upd["new"] == {"id": 1, "note": "b"}  # big is not sent, and not null either
    assert upd["unchanged_toast"] == ["big"]


def test_replica_identity_full_no_pk_and_odd_identifiers(
    harness: Harness, unique_name: str
) -> None:
    schema = f'Odd "Schema" {unique_name}'
    table = "Tåble With Spaces"
    harness.sql(f"CREATE SCHEMA {q(schema)}")
    harness.sql(f'CREATE TABLE {q(schema)}.{q(table)} ("ID" int PRIMARY KEY, "Value Col" text)')
    harness.sql(f"ALTER TABLE {q(schema)}.{q(table)} REPLICA IDENTITY FULL")
    harness.sql(f"CREATE TABLE {unique_name}_nopk (line text)")
    harness.start()
    harness.sql(f"INSERT INTO {q(schema)}.{q(table)} VALUES (1, 'x')")
    harness.sql(f"""UPDATE {q(schema)}.{q(table)} SET "Value Col" = 'y'""")
    # A table without a key is not published (filters.keyless_tables=skip): the
    # application's UPDATE on it works, and it streams nothing.
    harness.sql(f"INSERT INTO {unique_name}_nopk VALUES ('hello')")
    harness.sql(f"UPDATE {unique_name}_nopk SET line = 'hello!'")
    harness.events(
        lambda s: len([e for e in s if e.get("schema") == schema and e["op"] != "ddl"]) >= 2
    )
    odd = [e for e in harness.seen if e.get("schema") == schema and e["op"] != "ddl"]
    assert [e["table"] for e in odd] == [table, table]
    assert odd[1]["old"] == {"ID": 1, "Value Col": "x"}  # FULL identity: the whole old row
    assert odd[1]["new"] == {"ID": 1, "Value Col": "y"}
    assert odd[1]["key"] == {"ID": 1}
    published = harness.sql(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
        [harness.settings.replication.publication],
    )
    assert (table,) in published
    assert (f"{unique_name}_nopk",) not in published


def test_concurrent_transactions_arrive_in_commit_order(harness: Harness, unique_name: str) -> None:
    t = f"{unique_name}_cc"
    harness.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, who text)")
    harness.start()
    with psycopg.connect(harness.dsn) as a, psycopg.connect(harness.dsn) as b:
        a.execute(f"INSERT INTO {t} VALUES (1, 'a-first-statement')")
        b.execute(f"INSERT INTO {t} VALUES (2, 'b')")
        a.execute(f"INSERT INTO {t} VALUES (3, 'a-second-statement')")
        b.commit()  # b started later but commits first
        a.commit()
    harness.events(lambda s: len(data(s, t)) >= 3)
    evs = harness.table_events(t)
    assert [e["new"]["id"] for e in evs] == [2, 1, 3]
    assert evs[1]["xid"] == evs[2]["xid"] != evs[0]["xid"]


def test_slot_confirmed_only_after_kafka_ack_and_restart_resumes(
    harness: Harness, unique_name: str
) -> None:
    t = f"{unique_name}_ck"
    harness.sql(f"CREATE TABLE {t} (id int PRIMARY KEY)")
    start_lsn = harness.slot_confirmed()
    harness.start()
    for i in range(20):
        harness.sql(f"INSERT INTO {t} VALUES ({i})")
    harness.events(lambda s: len(data(s, t)) >= 20)
    harness.stop()
    confirmed = harness.slot_confirmed()
    last_commit = max(e["commit_lsn"] for e in harness.table_events(t))
    assert confirmed > last_commit > start_lsn
    # while stopped, more changes; the restart picks up exactly after the confirmed LSN
    for i in range(20, 30):
        harness.sql(f"INSERT INTO {t} VALUES ({i})")
    harness.start()
    harness.events(lambda s: len({e["new"]["id"] for e in data(s, t)}) >= 30)
    evs = harness.table_events(t)
    ids = [e["new"]["id"] for e in evs]
    assert sorted(set(ids)) == list(range(30))
    # redeliveries, if any, are same-LSN duplicates, never new values
    by_lsn: dict[int, int] = {}
    for e in evs:
        assert by_lsn.setdefault(e["lsn"], e["new"]["id"]) == e["new"]["id"]


def test_primary_key_partitioning(make_harness: HarnessFactory, unique_name: str) -> None:
    h = make_harness(producer={"partition_key": "primary_key"})
    t = f"{unique_name}_pk"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
    h.start()
    h.sql(f"INSERT INTO {t} SELECT g, 0 FROM generate_series(1, 30) g")
    h.sql(f"UPDATE {t} SET v = 1 WHERE id = 7")
    h.events(lambda s: len(data(s, t)) >= 31)
    pairs = [(k, e) for k, e in zip(h.keys, h.seen, strict=True) if e in data(h.seen, t)]
    assert len({k for k, _ in pairs}) == 30  # one key per row
    row7 = {k for k, e in pairs if e["new"]["id"] == 7}
    assert len(row7) == 1  # both changes of row 7 share a key, hence a partition


def test_missing_slot_is_a_permanent_error_with_the_fix(env_file: Path, unique_name: str) -> None:
    settings = make_settings(env_file, unique_name)
    ensure_topic(settings.kafka.client_config(), settings.producer.topic, 1, 1)
    service = build(settings)
    try:
        with pytest.raises(PermanentError, match="pg2kafka init"):
            service.run()
    finally:
        delete_topic(settings)


def test_role_without_replication_is_refused_at_init(
    env_file: Path, stack_env: dict[str, str], unique_name: str
) -> None:
    role = f"{unique_name}_norep"
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")
    try:
        settings = make_settings(
            env_file, unique_name, postgres={"user": role, "password": f"pw-{role}"}
        )
        with pytest.raises(PermanentError, match="REPLICATION"):
            admin.init(settings)
    finally:
        with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


def test_cli_rejects_unknown_key_and_reports_status(env_file: Path, unique_name: str) -> None:
    env = {**os.environ, "PG2KAFKA_PRODUCER__TOPICS": "typo"}
    proc = subprocess.run(
        [sys.executable, "-m", "services.pg2kafka", "--env-file", str(env_file), "status"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 2
    assert "PG2KAFKA_PRODUCER__TOPICS" in proc.stderr
    env = {
        **os.environ,
        "PG2KAFKA_REPLICATION__SLOT": unique_name,
        "PG2KAFKA_REPLICATION__PUBLICATION": unique_name,
        "PG2KAFKA_FILTERS__INCLUDE": json.dumps(own_tables(unique_name)),
    }
    base = [sys.executable, "-m", "services.pg2kafka", "--env-file", str(env_file)]
    try:
        out = subprocess.run([*base, "init"], capture_output=True, text=True, env=env, check=True)
        assert f"created  slot {unique_name}" in out.stdout
        out = subprocess.run([*base, "init"], capture_output=True, text=True, env=env, check=True)
        assert f"exists   slot {unique_name}" in out.stdout
        out = subprocess.run(
            [*base, "status", "--json"], capture_output=True, text=True, env=env, check=True
        )
        info = json.loads(out.stdout)
        assert info["slot_exists"] is True
        assert info["kafka_reachable"] is True
        assert isinstance(info["lag_bytes"], int)
    finally:
        subprocess.run([*base, "tear-down"], capture_output=True, env=env, check=True)


def test_slot_advances_on_a_fully_filtered_database(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """Only a table that never changes is published; heavy writes elsewhere must not pin
    WAL: heartbeats and keepalives move the confirmed LSN past them."""
    quiet = f"{unique_name}_quiet"
    busy = f"{unique_name}_busy"
    h = make_harness(
        init=False,
        filters={"include": [f"public.{quiet}"]},
        replication={"heartbeat_interval_s": 1.0},
    )
    h.sql(f"CREATE TABLE {quiet} (id int PRIMARY KEY)")
    h.sql(f"CREATE TABLE {busy} (id int PRIMARY KEY, pad text)")
    admin.init(h.settings)
    h.start()
    h.sql(f"INSERT INTO {busy} SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    target = int(h.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
    deadline = time.monotonic() + 60
    while h.slot_confirmed() < target:
        assert time.monotonic() < deadline, "slot did not advance past the filtered writes"
        time.sleep(0.2)
    # and nothing of the filtered table reached Kafka: the topic is still empty
    consumer = Consumer(
        {
            "bootstrap.servers": h.settings.kafka.bootstrap_servers,
            "group.id": f"{unique_name}-empty",
        }
    )
    try:
        topic = h.settings.producer.topic
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(3)
        ]
    finally:
        consumer.close()
    assert ends == [0, 0, 0]


def test_replica_identity_using_index(harness: Harness, unique_name: str) -> None:
    t = f"{unique_name}_ri"
    harness.sql(f"CREATE TABLE {t} (id int NOT NULL, code text NOT NULL, v int)")
    harness.sql(f"CREATE UNIQUE INDEX {t}_code ON {t} (code)")
    harness.sql(f"ALTER TABLE {t} REPLICA IDENTITY USING INDEX {t}_code")
    harness.start()
    harness.sql(f"INSERT INTO {t} VALUES (1, 'a', 0)")
    harness.sql(f"UPDATE {t} SET code = 'b' WHERE id = 1")
    harness.sql(f"DELETE FROM {t} WHERE id = 1")
    harness.events(lambda s: len(data(s, t)) >= 4)
    ins, gone, moved, dele = harness.table_events(t)
    assert ins["key"] == {"code": "a"}
    # the identity changed: a delete of the old key, then an insert under the new one
    assert (gone["op"], gone["key"], gone["old"]) == ("delete", {"code": "a"}, {"code": "a"})
    assert (moved["op"], moved["key"]) == ("insert", {"code": "b"})
    assert moved["new"] == {"id": 1, "code": "b", "v": 0}
    assert (gone["lsn"], gone["seq"] + 1) == (moved["lsn"], moved["seq"])
    assert dele["key"] == {"code": "b"}


def test_per_table_topic_routing(make_harness: HarnessFactory, unique_name: str) -> None:
    h = make_harness(producer={"topic_template": unique_name + ".{schema}.{table}"})
    a, b = f"{unique_name}_a", f"{unique_name}_b"
    created = [f"{unique_name}.public.{a}", f"{unique_name}.public.{b}"]
    try:
        h.sql(f"CREATE TABLE {a} (id int PRIMARY KEY)")
        h.sql(f"CREATE TABLE {b} (id int PRIMARY KEY)")
        # A name Kafka refuses as a topic ("cdc.public.Order Items"): sanitised, with a
        # hash suffix, never a stop.
        odd = f'"{unique_name} Order Items"'
        h.sql(f"CREATE TABLE {odd} (id int PRIMARY KEY)")
        h.start()
        h.sql(f"INSERT INTO {a} VALUES (1)")
        h.sql(f"INSERT INTO {b} VALUES (2)")
        h.sql(f"INSERT INTO {odd} VALUES (3)")
        got: dict[str, list[int]] = {}
        consumer = Consumer(
            {
                "bootstrap.servers": h.settings.kafka.bootstrap_servers,
                "group.id": f"{unique_name}-route",
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        consumer.subscribe([f"^{unique_name}\\..*"])
        deadline = time.monotonic() + 60
        try:
            while sum(len(v) for v in got.values()) < 3 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                ev = json.loads(msg.value())
                if ev["op"] == "insert":
                    got.setdefault(msg.topic(), []).append(ev["new"]["id"])
        finally:
            consumer.close()
        odd_topic = next(t for t in got if t not in created)
        created.append(odd_topic)
        assert re.fullmatch(
            rf"{unique_name}\.public\.{unique_name}_Order_Items-[0-9a-f]{{10}}", odd_topic
        )
        assert got == {created[0]: [1], created[1]: [2], odd_topic: [3]}
    finally:
        h.stop()
        h.sql(f'DROP TABLE IF EXISTS "{unique_name} Order Items"')
        client = AdminClient(h.settings.kafka.client_config())
        for fut in client.delete_topics(created).values():
            fut.result(30)


def test_slot_streamed_by_another_consumer_is_a_permanent_error(
    harness: Harness, unique_name: str
) -> None:
    slot = harness.settings.replication.slot
    recv = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_recvlogical"))[-1]
    other = subprocess.Popen(
        [
            str(recv),
            "-d",
            harness.dsn,
            "--slot",
            slot,
            "--start",
            "-o",
            "proto_version=1",
            "-o",
            f"publication_names={harness.settings.replication.publication}",
            "-f",
            "/dev/null",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not harness.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", [slot]
        ):
            assert time.monotonic() < deadline, "pg_recvlogical did not take the slot"
            time.sleep(0.1)
        settings = harness.settings.model_copy(
            update={
                "replication": harness.settings.replication.model_copy(
                    update={"slot_busy_grace_s": 1.0, "wal_sender_timeout_s": 2.0}
                )
            }
        )
        with pytest.raises(PermanentError, match="streamed by another process") as info:
            build(settings).run()
        assert "pg_recvlogical" in str(info.value)
    finally:
        other.terminate()
        other.wait(30)


def test_bad_credentials_stop_at_once_with_the_fix(env_file: Path, unique_name: str) -> None:
    env = {
        **os.environ,
        "PG2KAFKA_POSTGRES__PASSWORD": "not-the-password",
        "PG2KAFKA_REPLICATION__SLOT": unique_name,
        "PG2KAFKA_HTTP__PORT": "0",
        "PG2KAFKA_PRODUCER__TOPIC": f"{unique_name}.cdc",
        "PG2KAFKA_PRODUCER__CREATE_TOPIC": "true",
        "PG2KAFKA_LOG__FORMAT": "text",
    }
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "services.pg2kafka", "--env-file", str(env_file), "run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    try:
        assert proc.returncode == 1
        assert time.monotonic() - started < 30  # no retry loop on a wrong password
        assert "password authentication failed" in proc.stderr
        assert "check postgres.user and postgres.password" in proc.stderr
        assert "not-the-password" not in proc.stderr
    finally:
        client = AdminClient(make_settings(env_file, unique_name).kafka.client_config())
        topic = f"{unique_name}.cdc"
        if topic in client.list_topics(timeout=10).topics:
            client.delete_topics([topic])[topic].result(30)


def test_slot_advances_on_an_idle_database(
    make_harness: HarnessFactory, stack_env: dict[str, str], unique_name: str
) -> None:
    """Nothing happens in pg2kafka's database while another database on the same server
    writes a lot: the slot still follows the server's WAL instead of pinning it."""
    other = f"{unique_name}_db"
    h = make_harness(replication={"heartbeat_interval_s": 1.0})
    h.sql(f"CREATE DATABASE {other}")
    try:
        h.start()
        other_dsn = stack_env["WALCAST_PG_DSN"].rsplit("/", 1)[0] + f"/{other}"
        with psycopg.connect(other_dsn, autocommit=True) as c:
            c.execute("CREATE TABLE busy (id int PRIMARY KEY, pad text)")
            c.execute(
                "INSERT INTO busy SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g"
            )
        target = int(h.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        deadline = time.monotonic() + 60
        while h.slot_confirmed() < target:
            assert time.monotonic() < deadline, "the slot stayed behind the server's WAL"
            time.sleep(0.2)
    finally:
        h.stop()
        h.sql(f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")


def test_a_change_larger_than_the_topic_takes_is_a_reference_never_a_stop(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """Before: Kafka refused the record, the failure was permanent, CDC stopped (and the
    same change was first in line after every restart) while WAL piled up."""
    h = make_harness(init=False)
    topic = h.settings.producer.topic
    client = AdminClient(h.settings.kafka.client_config())
    small = NewTopic(topic, 3, 1, config={"max.message.bytes": "1000000"})  # a broker default
    client.create_topics([small])[topic].result(30)
    admin.init(h.settings)
    t = f"{unique_name}_big"
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, body text)")
    h.start()
    body = "".join(random.choices(string.ascii_letters, k=1_500_000))
    h.sql(f"INSERT INTO {t} VALUES (1, %s)", [body])
    h.sql(f"INSERT INTO {t} VALUES (2, 'small')")  # the stream goes on past it
    h.events(lambda s: len(data(s, t)) >= 2)
    big, after = data(h.seen, t)
    assert big["oversized"] > 1_500_000
    assert big["key"] == {"id": 1}
    assert big["new"] is None
    assert after["new"] == {"id": 2, "body": "small"}
    assert h.service is not None
    assert h.service.cdc.metrics.oversized._value.get() == 1
