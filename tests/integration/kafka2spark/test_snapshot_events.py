"""kafka2spark applies a snapshot's events (docs/events.md, "Snapshots") to the Delta
mirror: ``read`` rows MERGE like inserts, guarded by ``_walcast_lsn``; the end marker at
version S removes the rows older than S, keeps the rest, records S - 1 as the floor (the
snapshot's own rows, version S, still land after it), and does nothing a second time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from shared.kafka import ensure_topic
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2search.test_snapshot_events import S, marker, read
from tests.integration.kafka2spark.conftest import MirrorFactory


def rows(path: Path) -> dict[int, dict[str, Any]]:
    """The mirror's rows by id, without verify's columns (the row hash, the xid)."""
    table = DeltaTable(str(path)).to_pyarrow_table().drop_columns(list(VERIFY_COLUMNS))
    return {r["id"]: r for r in table.to_pylist()}


VERIFY_COLUMNS = ("_walcast_hash", "_walcast_xid")


def row(row_id: int, lsn: int) -> dict[str, Any]:
    return {"id": row_id, "v": lsn, "_walcast_lsn": lsn}


def test_read_rows_merge_and_the_end_marker_sweeps_older_rows(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.snap"
    t = "snap"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 2, 1)
    try:
        producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})

        def send(partition: int, *values: bytes) -> None:
            for value in values:
                producer.produce(topic, value, b"k", partition=partition)
            producer.flush(10)

        # The mirror from before the snapshot: 2 was deleted in the source since (its
        # delete lost), 3 changed after the snapshot read it.
        send(1, change(t, "insert", 100, 1), change(t, "insert", 200, 2))
        send(1, change(t, "insert", 1500, 3), change(t, "insert", 500, 4))
        m.feed(0, partitions=[1])
        path = m.path(t)
        assert sorted(rows(path)) == [1, 2, 3, 4]
        # Partition 0: the snapshot of rows 4 and 3 and its end marker, then a change
        # older than the snapshot (stays out) and a newer one.
        send(0, marker(t, "start"), read(t, 4, 0), read(t, 3, 1), marker(t, "end", rows=3))
        send(0, change(t, "insert", 900, 6), change(t, "insert", 2100, 7))
        first = m.feed(1, partitions=[0])
        # 1 and 2, and 6 (900 < S: merged in LSN order before the marker, then swept)
        assert first.schema_changes == [
            f"public.{t}: snapshot 3 started",
            f"public.{t}: snapshot 3 ended, 3 rows older than it removed",
        ]
        assert rows(path) == {3: row(3, 1500), 4: row(4, S), 7: row(7, 2100)}
        assert DeltaTable(str(path)).metadata().configuration["walcast.truncated_lsn"] == str(S - 1)
        # Partition 1, read from its start again: the old rows stay out, the snapshot's
        # row 1 (version S) lands after the end marker, whose copy does nothing.
        send(1, marker(t, "start"), read(t, 1, 0), marker(t, "end", rows=3))
        send(1, change(t, "insert", 2000, 5))
        second = m.feed(2, partitions=[1])
        assert not any("ended" in c for c in second.schema_changes), second.schema_changes
        want = {1: row(1, S), 3: row(3, 1500), 4: row(4, S), 5: row(5, 2000), 7: row(7, 2100)}
        assert rows(path) == want
        # Everything redelivered: nothing changes.
        again = m.feed(3)
        assert not any("ended" in c for c in again.schema_changes), again.schema_changes
        assert rows(path) == want
    finally:
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)
