"""The local stack's Kafka takes idempotent acks=all writes and serves a consumer group."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic


@pytest.fixture
def topic(stack_env: dict[str, str], unique_name: str) -> str:
    admin = AdminClient({"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]})
    admin.create_topics([NewTopic(unique_name, 3, 1)])[unique_name].result(timeout=30)
    yield unique_name
    admin.delete_topics([unique_name])[unique_name].result(timeout=30)


def test_produce_and_consume_in_a_group(stack_env: dict[str, str], topic: str) -> None:
    bootstrap = stack_env["WALCAST_KAFKA_BOOTSTRAP"]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    acked: list[tuple[int, int]] = []

    def on_ack(err: object, msg: object) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    for i in range(30):
        producer.produce(topic, key=f"k{i % 3}", value=f"v{i}", on_delivery=on_ack)
    assert producer.flush(30) == 0
    assert len(acked) == 30

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(seen) < 30 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            seen.append(msg.value().decode())
            consumer.commit(msg, asynchronous=False)
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"v{i}" for i in range(30))
