"""A waited-for offset commit has a deadline, against the real broker.

librdkafka's synchronous commit waits without end: after a Kafka restart a kafka2search
member sat for minutes in one, its partitions unread (issue 37, defect 4). Here the
broker is frozen (SIGSTOP: connections open, nothing answered — the coordinator as that
client saw it) at the worst moment, right before a commit that must be waited for, and
the member must give up on that client within the deadline, reconnect with a new one
once Kafka answers again, and bring every record to the sink exactly in order.

The sink and the checks here are the test's own: a list of ids, and the group's
committed offset read with a plain client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from shared.consumer import ConsumerLoop, ConsumerMetrics
from shared.contract.event import EventView
from shared.errors import NoAnswerError
from shared.interfaces import Origin, Wait
from shared.kafka import KafkaOffsetCheckpointer, close_consumer, ensure_topic
from shared.retry import BackoffPolicy
from shared.settings import BatchSettings, ConsumerSettings, KafkaSettings

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 3.0


def _kafka_pid() -> int:
    out = subprocess.run(
        [str(REPO / "deploy/local/walcast"), "status", "--json"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    for c in json.loads(out.stdout)["components"]:
        if c["name"] == "kafka" and c.get("pid"):
            return int(c["pid"])
    pytest.skip("Kafka is not a local process here (containers backend): it cannot be frozen")


@dataclass
class _Freeze:
    """``freeze``: set it to stop Kafka; ``frozen``: set once the broker is stopped."""

    freeze: threading.Event = field(default_factory=threading.Event)
    frozen: threading.Event = field(default_factory=threading.Event)

    def now(self) -> None:
        """Stop Kafka and return once it is stopped."""
        self.freeze.set()
        assert self.frozen.wait(10), "Kafka was not stopped within 10 s"


@contextmanager
def _frozen_until_released(max_s: float = 30.0) -> Iterator[_Freeze]:
    """Kafka, to be frozen (SIGSTOP) by the test. The broker is let go on exit, or after
    ``max_s`` whatever the test's thread is doing (so a commit without a deadline ends
    and the test fails, instead of hanging with the broker stopped)."""
    pid = _kafka_pid()
    state, release = _Freeze(), threading.Event()

    def watch() -> None:
        state.freeze.wait()
        if release.is_set():
            return
        os.kill(pid, signal.SIGSTOP)
        state.frozen.set()
        try:
            release.wait(max_s)
        finally:
            os.kill(pid, signal.SIGCONT)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield state
    finally:
        release.set()
        state.freeze.set()
        watcher.join(10)
        os.kill(pid, signal.SIGCONT)


def _wait(condition: Any, timeout: float, diagnosis: Any) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(diagnosis())
        time.sleep(0.1)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(60) == 0, "the test's records were not all delivered"


def _event(op: str, doc_id: int, lsn: int) -> bytes:
    ev: dict[str, Any] = {"v": 1, "op": op, "db": "app", "schema": "public", "table": "t",
                          "lsn": lsn, "key": {"id": doc_id}, "new": {"id": doc_id}}  # fmt: skip
    if op == "ddl":
        ev |= {"key": {}, "new": None, "ddl": {"tag": "ALTER TABLE", "columns": []}}
    return orjson.dumps(ev)


def _committed(bootstrap: str, group: str, topic: str) -> int:
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = reader.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        reader.close()


def test_a_commit_the_broker_never_answers_fails_at_its_deadline(
    stack_env: dict[str, str], unique_name: str
) -> None:
    bootstrap = stack_env["WALCAST_KAFKA_BOOTSTRAP"]
    topic = f"deadline-{unique_name}"[:200]
    ensure_topic({"bootstrap.servers": bootstrap}, topic, 1, 1)
    _produce(bootstrap, topic, [b"x"] * 10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([topic])
    got: list[Any] = []
    _wait(lambda: got.extend(consumer.consume(10, 0.5)) or len(got) >= 10, 60,
          lambda: f"only {len(got)} of 10 records consumed")  # fmt: skip
    checkpointer = KafkaOffsetCheckpointer(consumer, timeout_s=DEADLINE_S)
    checkpointer.commit({(topic, 0): 4})  # answered: the broker is up
    with _frozen_until_released() as kafka:
        kafka.now()
        began = time.monotonic()
        with pytest.raises(NoAnswerError, match="did not answer an offset commit"):
            checkpointer.commit({(topic, 0): 9})
        waited = time.monotonic() - began
        assert checkpointer.stuck is not None
        with pytest.raises(NoAnswerError):  # the stuck client is not used again
            checkpointer.commit({(topic, 0): 9})
    assert waited < DEADLINE_S + 10, f"the commit waited {waited:.1f} s for a frozen broker"
    close_consumer(consumer, timeout_s=60, stuck=checkpointer.stuck)
    # The commit that got no answer in time may still have landed once the broker went
    # on; what is certain is that the answered one did.
    assert _committed(bootstrap, topic, topic) in (5, 10)


class _Batch:
    def __init__(self) -> None:
        self.ids: list[int] = []
        self.records = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.ids)

    def clear(self) -> None:
        self.ids.clear()
        self.records = self.bytes = 0


@dataclass
class _ListSink:
    """Keeps the ids in the order written; freezes Kafka when the first control event
    is applied — right before the loop commits it with a waited-for commit."""

    kafka: _Freeze
    written: list[int] = field(default_factory=list)
    controls: list[int] = field(default_factory=list)  # len(written) at each control

    def new_batch(self) -> _Batch:
        return _Batch()

    def add(self, batch: _Batch, event: EventView, origin: Origin) -> str | None:
        batch.records += 1
        batch.bytes += len(origin.value)
        batch.ids.append(int(event.key["id"]))
        return None

    def write(
        self, batch: _Batch, sleep: Wait, before: tuple[Future[Any], ...]
    ) -> list[tuple[Origin, str]]:
        self.written.extend(batch.ids)
        return []

    def control(self, event: EventView) -> None:
        self.controls.append(len(self.written))
        if len(self.controls) == 1:
            self.kafka.now()


def test_a_member_whose_commit_gets_no_answer_reconnects_and_loses_nothing(
    stack_env: dict[str, str], unique_name: str
) -> None:
    bootstrap = stack_env["WALCAST_KAFKA_BOOTSTRAP"]
    topic = f"deadline-loop-{unique_name}"[:200]
    ensure_topic({"bootstrap.servers": bootstrap}, topic, 1, 1)
    values = [_event("insert", i, 100 + i) for i in range(1, 21)]
    values += [_event("ddl", 0, 200)]
    values += [_event("insert", i, 200 + i) for i in range(21, 41)]
    _produce(bootstrap, topic, values)
    with _frozen_until_released() as kafka:
        sink = _ListSink(kafka)
        checkpointers: list[KafkaOffsetCheckpointer] = []
        stop = threading.Event()

        def make_consumer(config: dict[str, Any]) -> Consumer:
            assert loop.checkpointer is not None
            checkpointers.append(loop.checkpointer)
            return Consumer(config)

        loop = ConsumerLoop[_Batch](
            name="commit-deadline",
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            consumer=ConsumerSettings(
                topics=[topic],
                group_id=topic,
                dlq_topic=f"{topic}.dlq",
                commit_timeout_s=DEADLINE_S,
            ),
            batch=BatchSettings(max_wait_s=0.2, concurrency=1),  # writes in order
            retry=BackoffPolicy(initial_s=0.2, max_s=1.0),
            metrics=ConsumerMetrics(CollectorRegistry(), "deadline"),
            sink=sink,
            stop_event=stop,
            make_consumer=make_consumer,
        )
        errors: list[BaseException] = []

        def run() -> None:
            try:
                loop.run()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        try:
            _wait(
                kafka.frozen.is_set,
                120,
                lambda: f"no DDL reached the sink: {len(sink.written)} ids",
            )
            frozen_at = time.monotonic()
            _wait(
                lambda: checkpointers[0].stuck is not None,
                DEADLINE_S + 30,
                lambda: (
                    f"the commit after the DDL was still waiting"
                    f" {time.monotonic() - frozen_at:.0f} s after Kafka froze"
                ),
            )
        except BaseException:
            stop.set()  # the loop ends with the test
            raise
    # Kafka answers again: a new consumer reads from the last commit and finishes.
    try:
        _wait(
            lambda: _committed(bootstrap, topic, topic) == len(values) or bool(errors),
            180,
            lambda: (
                f"the group's offset is {_committed(bootstrap, topic, topic)}, not"
                f" {len(values)}; consumers made: {len(checkpointers)};"
                f" written: {len(sink.written)}"
            ),
        )
    finally:
        stop.set()
        runner.join(60)
    assert not errors, errors
    assert not runner.is_alive(), "the loop did not stop within 60 s"
    assert len(checkpointers) >= 2, "the member never reconnected after the unanswered commit"
    # Committed before the freeze: the records before the DDL (never read again). The
    # DDL's own commit got no answer, so the new consumer read it again (or, had that
    # commit landed once Kafka went on, the records after it): each record after the
    # DDL written once, in order, after it.
    assert sink.controls[0] == 20
    assert sink.written == list(range(1, 41)), sink.written
