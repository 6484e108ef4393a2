"""Hostile Debezium records against a running kafka2search (issue 36, finding 3): each is
dead-lettered with the reason, the records after it are indexed and the group's offsets
are committed past all of them — where before the fix the service died on the first and
died again on it after every restart."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from shared.kafka import ensure_topic
from tests.integration.kafka2search.conftest import IndexerFactory
from tests.unit.test_hostile_records import ARRAYS_600, BITS, SCALE, debezium


def _row(i: int) -> tuple[bytes, bytes]:
    key, value = debezium({"type": "string"}, f"row {i}")
    return key.replace(b"1", str(i).encode()), value.replace(b'"id": 1', f'"id": {i}'.encode())


@pytest.mark.parametrize("engine_kind", ["opensearch"])
def test_hostile_debezium_records_are_dead_lettered_and_the_next_ones_indexed(
    make_indexer: IndexerFactory, unique_name: str, engine_kind: str
) -> None:
    topic = f"{unique_name}.debezium"
    ix = make_indexer(topic, consumer={"input_format": "debezium"})
    config = ix.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    records = [_row(1), SCALE, _row(2), BITS, ARRAYS_600, _row(3)]
    producer = Producer(config)
    for key, value in records:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0
    ix.start()
    ix.wait(lambda: len(ix.docs_all("t", "s")) == 3, "the three rows indexed")
    assert {d["x"] for d in ix.docs_all("t", "s").values()} == {"row 1", "row 2", "row 3"}
    letters = ix.dead_letters(3)
    reasons = [letter["headers"]["walcast-error"].decode() for letter in letters]
    assert [letter["headers"]["walcast-source-offset"] for letter in letters] == [b"1", b"3", b"4"]
    assert "decimal scale -1000000000000000 is beyond ±16383" in reasons[0]
    assert "bit string length '1000000000000000'… is beyond 83886080" in reasons[1]
    assert "arrays nested deeper than 6 dimensions" in reasons[2]
    assert {letter["headers"]["walcast-error-kind"] for letter in letters} == {b"poison"}

    def committed() -> int:
        c = Consumer({**config, "group.id": ix.settings.consumer.group_id})
        try:
            (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
            return int(tp.offset)
        finally:
            c.close()

    ix.wait(lambda: committed() == len(records), "offsets committed past every record")
    assert not ix.error  # still running
