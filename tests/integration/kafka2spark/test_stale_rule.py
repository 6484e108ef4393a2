"""The Delta mirror, restarted (a new mirror reads its floor back from the table's
properties): a change at or below its table's floor stays out; a change for a row the
mirror does not hold, above the floor, is never refused; of a held row only the newer
change wins. Events crafted by hand so that versions are chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from shared.kafka import ensure_topic
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2spark.conftest import MirrorFactory


def rows(path: Path) -> dict[int, dict[str, Any]]:
    return {r["id"]: r for r in DeltaTable(str(path)).to_pyarrow_table().to_pylist()}


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
