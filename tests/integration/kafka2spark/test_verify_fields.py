"""kafka2spark's mirror rows hold the row hash and transaction of the version they hold
(tests/integration/verify_events.py says what and why)."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

from shared.kafka import ensure_topic
from tests.integration.kafka2spark.conftest import MirrorFactory
from tests.integration.verify_events import EVENTS, WANT, T


def test_mirror_rows_hold_the_versions_hash_and_transaction(
    make_mirror: MirrorFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.cdc"
    m = make_mirror(topic)
    config = m.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    try:
        # in two batches: the fill of row 4 by its read row is a MERGE into a held row
        producer = Producer({"bootstrap.servers": m.settings.kafka.bootstrap_servers})
        for value in EVENTS[:-1]:
            producer.produce(topic, value, b"k")
        producer.flush(10)
        m.feed(0)
        producer.produce(topic, EVENTS[-1], b"k")
        producer.flush(10)
        m.feed(1)
        rows = DeltaTable(str(m.path(T))).to_pyarrow_table().to_pylist()
        got = {r["id"]: (r["_walcast_hash"], r["_walcast_xid"]) for r in rows}
        assert got == WANT
    finally:
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)
