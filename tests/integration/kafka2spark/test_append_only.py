"""Rows of insert-only tables (``append_only``, no key) in the Delta mirror: each row once,
by its row id, through redeliveries within a batch, a batch run again after a crash
(same batch id) and a replay under a fresh checkpoint (new batch ids); a truncate empties
the mirror; when the table gains a key, its automatic snapshot's keyed rows are MERGEd
into the same mirror and the end marker removes the append-only rows. Read with the
``deltalake`` package, not Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T  # noqa: N812 - the PySpark convention

from services.kafka2spark.append_only import row_id
from shared.contract.event import append_only_id
from shared.kafka import ensure_topic
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2search.test_snapshot_events import S, marker, read
from tests.integration.kafka2spark.conftest import MirrorFactory


def appended(table: str, lsn: int, seq: int, value: int) -> bytes:
    """An insert of an insert-only table: no key, ``append_only``; the row
    ``{"id": value, "v": lsn}`` (two rows may be equal)."""
    ev = orjson.loads(change(table, "insert", lsn, value, keyless=True))
    return orjson.dumps(ev | {"seq": seq, "commit_lsn": lsn + 8, "append_only": True})


def mirrored(path: Path) -> list[tuple[Any, ...]]:
    """The mirror's rows as (id, v, _walcast_lsn, _walcast_row_id), sorted."""
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(
        (r["id"], r["v"], r["_walcast_lsn"], r["_walcast_row_id"]) for r in rows
    )  # fmt: skip


def test_append_only_rows_once_each_through_replays_truncate_and_a_key(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.history"
    t = "history"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    try:
        producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})

        def send(*values: bytes) -> None:
            for value in values:
                producer.produce(topic, value, b"")
            producer.flush(10)

        # Two equal rows of one transaction (seq 0 and 1), a third, and the first record
        # again in the same batch (a producer's redelivery).
        first = [appended(t, 100, 0, 1), appended(t, 100, 1, 1), appended(t, 200, 0, 2)]
        send(*first, first[0])
        want = [(1, 100, 100, "108.0"), (1, 100, 100, "108.1"), (2, 200, 200, "208.0")]
        path = m.path(t)
        assert m.feed(0).merged == {f"public.{t}": 3}
        assert mirrored(path) == want
        # Spark runs the batch again after a crash between its writes and its checkpoint
        # (the same records, the same batch id); then a replay from a fresh checkpoint
        # (batch ids start again) and one more batch with everything redelivered.
        for batch_id in (0, 0, 1):
            m.feed(batch_id)
            assert mirrored(path) == want, batch_id
        # The changelog keeps every record, marked as the rows of an insert-only table.
        log = DeltaTable(str(m.settings.delta.root / m.settings.delta.changelog_table))
        flags = log.to_pyarrow_table(columns=["append_only"]).column(0).to_pylist()
        assert flags
        assert all(flags)
        # A truncate empties the mirror; a row after it lands.
        send(change(t, "truncate", 400), appended(t, 500, 0, 5))
        m.feed(2)
        assert mirrored(path) == [(5, 500, 500, "508.0")]
        # The table gains a key: the automatic snapshot's keyed rows (version S) and its
        # end marker remove the append-only rows; an old one redelivered stays out.
        send(appended(t, 600, 0, 6), marker(t, "start"), read(t, 1, 0), read(t, 5, 1))
        send(marker(t, "end", rows=2), appended(t, 600, 0, 6), change(t, "insert", S + 10, 7))
        m.feed(3)
        keyed = [(1, S, S, None), (5, S, S, None), (7, S + 10, S + 10, None)]
        assert mirrored(path) == keyed
        m.feed(4)  # everything once more, from offset 0
        assert mirrored(path) == keyed
    finally:
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)


def test_a_keyed_mirror_takes_append_only_rows_after_its_key_is_dropped(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.events"
    t = "events"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    try:
        producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})
        producer.produce(topic, change(t, "insert", 100, 1), b"")
        producer.flush(10)
        m.feed(0)
        producer.produce(topic, appended(t, 300, 0, 1), b"")
        producer.flush(10)
        m.feed(1)
        m.feed(1)
        want = [(1, 100, 100, None), (1, 300, 300, "308.0")]
        assert mirrored(m.path(t)) == want
    finally:
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)


def test_the_mirrors_row_id_is_the_contracts(spark: SparkSession) -> None:
    cases = [
        (108, 0, None, None),
        (108, 3, 0, None),
        (2**40, 7, 2, None),
        (1000, 4, None, {"id": 9, "chunk": 2}),
        (1000, 4, 1, {"id": 9, "chunk": 0}),
    ]
    snapshot = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("chunk", T.LongType())]
    )
    schema = T.StructType(
        [
            T.StructField("commit_lsn", T.LongType()),
            T.StructField("seq", T.LongType()),
            T.StructField("epoch", T.LongType()),
            T.StructField("snapshot", snapshot),
        ]
    )
    got = [r[0] for r in spark.createDataFrame(cases, schema).select(row_id()).collect()]
    assert got == [
        append_only_id(epoch or 0, commit, seq, snap)  # type: ignore[arg-type]
        for commit, seq, epoch, snap in cases
    ]
