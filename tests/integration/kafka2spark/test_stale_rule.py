"""The Delta mirror, restarted (a new mirror reads its floor back from the table's
properties): a change at or below its table's floor stays out; a change for a row the
mirror does not hold, above the floor, is never refused; of a held row only the newer
change wins. Events crafted by hand so that versions are chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from shared.kafka import ensure_topic
from tests.integration.conftest import crafted_event as change
from tests.integration.conftest import crafted_toast as with_toast
from tests.integration.kafka2spark.conftest import MirrorFactory


def rows(path: Path) -> dict[int, dict[str, Any]]:
    """The mirror's rows by id, without verify's columns (the row hash, the xid)."""
    table = DeltaTable(str(path)).to_pyarrow_table().drop_columns(list(VERIFY_COLUMNS))
    return {r["id"]: r for r in table.to_pylist()}


VERIFY_COLUMNS = ("_walcast_hash", "_walcast_xid")


def row(row_id: int, lsn: int) -> dict[str, Any]:
    return {"id": row_id, "v": lsn, "_walcast_lsn": lsn}


def test_after_a_restart_the_mirror_refuses_only_what_is_below_its_floor_or_older_than_held(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.cdc"
    t = "accounts"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})

    def send(*values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"k")
        producer.flush(10)

    try:
        send(change(t, "insert", 100, 1), change(t, "insert", 100, 2), change(t, "truncate", 200))
        m.feed(0)
        path = m.path(t)
        assert rows(path) == {}
        restarted = make_mirror(topic)  # state from the table, not from memory
        send(
            change(t, "insert", 150, 3),  # below the floor, not held: stays out
            change(t, "insert", 250, 4),  # not held, above the floor
            change(t, "insert", 210, 5),  # not held, above the floor
            change(t, "update", 240, 4),  # older than 250
            change(t, "update", 260, 5),  # newer than 210
        )
        restarted.feed(1)  # the whole topic again: a replay too
        assert rows(path) == {4: row(4, 250), 5: row(5, 260)}
    finally:
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)


def test_an_older_full_row_fills_what_a_partial_row_lacked_after_a_restart(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    """The partial-row rule (shared.contract.event.fill_unfilled): an update without its
    unchanged TOAST value reaches a mirror that does not hold the row (its snapshot read
    row, at a lower version, comes later); the read row — the only full copy — fills it
    instead of being refused, also from a restarted mirror, in a later batch."""
    topic = f"{unique_name}.cdc"
    t = "docs"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})
    big = "x" * 5000

    def send(*values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"k")
        producer.flush(10)

    try:
        send(
            with_toast(change(t, "insert", 100, 3), "three"),
            with_toast(change(t, "update", 300, 1), None),
            with_toast(change(t, "update", 300, 2), None),
            with_toast(change(t, "update", 310, 3), None),  # its value in the batch
        )
        m.feed(0)
        path = m.path(t)
        got = rows(path)
        assert got[1] == {**row(1, 300), "big": None, "_walcast_unfilled": ["big"]}
        assert got[3] == {**row(3, 310), "big": "three", "_walcast_unfilled": None}
        restarted = make_mirror(topic)
        read = {"id": 1, "chunk": 0}
        send(
            with_toast(change(t, "read", 120, 1, snapshot=read), big),  # older, full: fills
            with_toast(change(t, "read", 120, 2, snapshot=read), None),  # lacks it too
            with_toast(change(t, "update", 400, 3), None),  # newer, partial: keeps "three"
        )
        restarted.feed(1)
        got = rows(path)
        assert got[1] == {**row(1, 300), "big": big, "_walcast_unfilled": None}
        assert got[2] == {**row(2, 300), "big": None, "_walcast_unfilled": ["big"]}
        assert got[3] == {**row(3, 400), "big": "three", "_walcast_unfilled": None}
    finally:
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)


def ddl(table: str, lsn: int, tag: str, statement: str, columns: list[str]) -> bytes:
    """A DDL event as pg2kafka writes it: the table after ``statement``; ``columns`` as
    ``name:num`` (types: int4, the TOAST column text)."""
    ev = orjson.loads(change(table, "ddl", lsn))
    cols = []
    for c in columns:
        name, num = c.split(":")
        cols.append({"name": name, "num": int(num), "type": "int4" if num in "12" else "text"})
    ev["ddl"] = {"tag": tag, "statement": statement, "columns": cols, "primary_key": ["id"]}
    return orjson.dumps(ev)


def test_a_column_waiting_to_be_filled_follows_its_rename_and_goes_with_its_drop(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    """A row still lacking a TOAST value when that column is renamed waits for it under
    the new name — the older row that brings it carries the new name — and stops waiting
    when the column is dropped."""
    topic = f"{unique_name}.cdc"
    t = "docs"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})

    def send(*values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"k")
        producer.flush(10)

    try:
        send(
            ddl(t, 50, "CREATE TABLE", f"CREATE TABLE {t} ()", ["id:1", "v:2", "big:3"]),
            with_toast(change(t, "update", 300, 1), None),
            with_toast(change(t, "update", 300, 2), None),
            ddl(
                t,
                350,
                "ALTER TABLE",
                f"ALTER TABLE {t} RENAME big TO body",
                ["id:1", "v:2", "body:3"],
            ),
        )
        m.feed(0)
        path = m.path(t)
        got = rows(path)
        assert got[1] == {**row(1, 300), "body": None, "_walcast_unfilled": ["body"]}
        read = orjson.loads(change(t, "read", 120, 1, snapshot={"id": 1, "chunk": 0}))
        read["types"]["body"] = "text"
        read["new"]["body"] = "the value"
        send(orjson.dumps(read))  # read after the rename, versioned below it
        m.feed(1)
        got = rows(path)  # filled under the new name
        assert got[1] == {**row(1, 300), "body": "the value", "_walcast_unfilled": None}
        assert got[2] == {**row(2, 300), "body": None, "_walcast_unfilled": ["body"]}
        send(ddl(t, 400, "ALTER TABLE", f"ALTER TABLE {t} DROP body", ["id:1", "v:2"]))
        m.feed(2)
        assert rows(path)[2] == {**row(2, 300), "_walcast_unfilled": None}  # nothing to wait for
    finally:
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)


def test_a_mirror_gets_the_unfilled_column_only_for_a_partial_row_it_cannot_fill(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    """Most partial rows find their value in the mirror: those leave its schema alone;
    the first that does not adds ``_walcast_unfilled``. Two partitions, fed one at a
    time, so the update's batch does not hold the insert."""
    topic = f"{unique_name}.cdc"
    t = "docs"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 2, 1)
    producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})
    try:
        producer.produce(topic, with_toast(change(t, "insert", 100, 1), "one"), b"k", 0)
        producer.produce(topic, with_toast(change(t, "update", 200, 1), None), b"k", 1)
        producer.flush(10)
        m.feed(0, [0])
        m.feed(1, [1])
        path = m.path(t)
        assert rows(path) == {1: {**row(1, 200), "big": "one"}}  # no bookkeeping column
        producer.produce(topic, with_toast(change(t, "update", 300, 2), None), b"k", 1)
        producer.flush(10)
        m.feed(2, [1])
        got = rows(path)
        assert got[1] == {**row(1, 200), "big": "one", "_walcast_unfilled": None}
        assert got[2] == {**row(2, 300), "big": None, "_walcast_unfilled": ["big"]}
    finally:
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)


def test_a_redelivered_older_row_never_overwrites_a_value_an_earlier_batch_stored(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    """pg2kafka, restarted, sends the stream again from its last confirmed position: a
    row from before an update that an earlier batch applied arrives after a newer change
    that left its TOAST value out. The stored value stays (the composition suite's seed
    39, in kafka2postgres); the older row only fills a row the mirror lacks. Partition 0
    is the first pass, partition 1 what follows it, fed one at a time."""
    topic = f"{unique_name}.cdc"
    t = "docs"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 2, 1)
    producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})
    try:
        read = {"id": 1, "chunk": 0}
        for value in (
            with_toast(change(t, "insert", 100, 1), "old"),
            with_toast(change(t, "update", 200, 1), "new"),  # the TOAST value changed
        ):
            producer.produce(topic, value, b"k", 0)
        for value in (
            with_toast(change(t, "update", 300, 1), None),  # left out: "new" stays
            with_toast(change(t, "insert", 100, 1), "old"),  # redelivered, older
            with_toast(change(t, "update", 310, 2), None),  # a row the mirror lacks
            with_toast(change(t, "read", 150, 2, snapshot=read), "read"),
        ):
            producer.produce(topic, value, b"k", 1)
        producer.flush(10)
        m.feed(0, [0])
        m.feed(1, [1])
        got = rows(m.path(t))
        # (nothing left unfilled: the mirror got no bookkeeping column for it)
        assert got == {1: {**row(1, 300), "big": "new"}, 2: {**row(2, 310), "big": "read"}}
        # a row stored without its value: a newer partial change is merged, and the
        # older row arriving after it fills the value the mirror lacks
        producer.produce(topic, with_toast(change(t, "update", 400, 3), None), b"k", 0)
        producer.flush(10)
        m.feed(2, [0])
        assert rows(m.path(t))[3] == {**row(3, 400), "big": None, "_walcast_unfilled": ["big"]}
        for value in (
            with_toast(change(t, "update", 410, 3), None),
            with_toast(change(t, "read", 160, 3, snapshot=read), "three"),
        ):
            producer.produce(topic, value, b"k", 1)
        producer.flush(10)
        m.feed(3, [1])
        assert rows(m.path(t))[3] == {**row(3, 410), "big": "three", "_walcast_unfilled": None}
    finally:
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)
