"""kafka2search applies a snapshot's events (docs/events.md, "Snapshots"): a ``read`` row
is indexed like an insert, versioned (one older than the stored document is stale); the
end marker at version S removes the documents older than S, keeps the rest, and lets the
snapshot's own rows (version S) land after it; a copy of it does nothing."""

from __future__ import annotations

from typing import Any

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from shared.kafka import ensure_topic
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2search.conftest import IndexerFactory

S = 1000  # the snapshot's version: restart_lsn - 1
SNAPSHOT_ID = 3


def read(table: str, row_id: int, seq: int, lsn: int = S) -> bytes:
    """A snapshot row as pg2kafka writes it: xid 0, seq = its number in the chunk."""
    ev = orjson.loads(change(table, "read", lsn, row_id, snapshot={"id": SNAPSHOT_ID, "chunk": 0}))
    return orjson.dumps(ev | {"seq": seq, "xid": 0})


def marker(table: str, phase: str, rows: int | None = None) -> bytes:
    info: dict[str, Any] = {"id": SNAPSHOT_ID, "phase": phase}
    if rows is not None:
        info["rows"] = rows
    ev = orjson.loads(change(table, "snapshot", S, snapshot=info))
    ev.pop("types")
    return orjson.dumps(ev | {"xid": 0})


def test_read_rows_and_the_end_marker_under_primary_key_partitioning(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.snap"
    t = "snap"
    ix = make_indexer(topic)
    config = ix.settings.kafka.client_config()
    ensure_topic(config, topic, 2, 1)
    try:
        producer = Producer({"bootstrap.servers": ix.settings.kafka.bootstrap_servers})

        def send(partition: int, *values: bytes) -> None:
            for value in values:
                producer.produce(topic, value, b"k", partition=partition)
            producer.flush(10)

        # What the index holds from before the snapshot: rows 1 and 2 changed long ago
        # (2 deleted in the source since, its delete lost), 3 changed after the read.
        send(1, change(t, "insert", 100, 1), change(t, "insert", 200, 2))
        send(1, change(t, "insert", 1500, 3), change(t, "insert", 500, 4))
        ix.start()
        ix.wait(lambda: set(ix.docs(t)) == {"1", "2", "3", "4"}, "the rows from before")
        assert ix.service is not None
        metrics = ix.service.indexer.metrics
        stale = metrics.stale._value.get()
        # Partition 0: the snapshot of rows 4 and 3, then its end marker; then a change
        # older than the snapshot, which must stay out.
        send(0, marker(t, "start"), read(t, 4, 0), read(t, 3, 1), marker(t, "end", rows=3))
        ix.wait(lambda: set(ix.docs(t)) == {"3", "4"}, "the rows older than S removed")
        docs = ix.docs(t)
        assert docs["4"] == {"id": 4, "v": S}  # the read row indexed (500 < S)
        assert docs["3"] == {"id": 3, "v": 1500}  # the read row older than the doc: stale
        assert metrics.stale._value.get() > stale
        send(0, change(t, "insert", 900, 6), change(t, "insert", 2100, 7))
        # Partition 1, behind: the snapshot's row 1 (version S) after the end marker
        # removed its old document, then the markers' copies, then a later change.
        send(1, marker(t, "start"), read(t, 1, 0), marker(t, "end", rows=3))
        send(1, change(t, "insert", 2000, 5))
        ix.wait(lambda: {"5", "7"} <= set(ix.docs(t)), "the changes after the snapshot")
        assert ix.docs(t) == {
            "1": {"id": 1, "v": S},
            "3": {"id": 3, "v": 1500},
            "4": {"id": 4, "v": S},
            "5": {"id": 5, "v": 2000},
            "7": {"id": 7, "v": 2100},
        }
        # The end marker was applied once; its copy on partition 1 did nothing.
        kinds = metrics.schema_changes
        assert kinds.labels("snapshot_end")._value.get() == 1
        assert kinds.labels("snapshot_start")._value.get() >= 1
        index = ix.es.resolve_alias(ix.alias(t))
        assert index is not None
        _props, meta = ix.es.mapping(index)
        assert meta["walcast"]["truncated_lsn"] == S - 1
    finally:
        ix.stop()
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)
