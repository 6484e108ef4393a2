"""KafkaOffsetCheckpointer against a consumer fake: what is committed, when it is known."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import ValidationError

from shared.errors import NoAnswerError, PermanentError
from shared.kafka import MAX_STUCK_CLIENTS, KafkaOffsetCheckpointer, close_consumer, stuck_clients
from shared.settings import ConsumerSettings


class FakeConsumer(Consumer):  # type: ignore[misc]
    """Records commits; answers a synchronous one as the broker would (or with ``fail``)."""

    def __init__(self) -> None:  # no librdkafka handle
        self.commits: list[tuple[list[tuple[str, int, int]], bool]] = []
        self.fail: KafkaError | None = None
        self.answer = threading.Event()  # cleared: a synchronous commit gets no answer
        self.answer.set()
        self.closed = threading.Event()

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        self.commits.append(([(t.topic, t.partition, t.offset) for t in offsets], asynchronous))
        if not asynchronous:
            self.answer.wait()
        if self.fail is not None:
            raise KafkaException(self.fail)
        return None if asynchronous else offsets

    def close(self) -> None:
        assert self.answer.is_set(), "closed while a commit was still waiting in it"
        self.closed.set()


def test_a_position_is_committed_as_the_next_offset_to_read() -> None:
    consumer = FakeConsumer()
    cp = KafkaOffsetCheckpointer(consumer)
    cp.commit({("t", 0): 41, ("t", 1): 9})
    assert consumer.commits == [([("t", 0, 42), ("t", 1, 10)], False)]
    assert cp.committed() == {("t", 0): 41, ("t", 1): 9}


def test_without_waiting_the_commit_is_known_only_from_the_callback() -> None:
    consumer = FakeConsumer()
    cp = KafkaOffsetCheckpointer(consumer)
    cp.commit({("t", 0): 41}, wait=False)
    assert consumer.commits == [([("t", 0, 42)], True)]
    assert cp.committed() is None  # not answered yet
    cp.on_commit(None, [TopicPartition("t", 0, 42)])
    assert cp.committed() == {("t", 0): 41}


def test_a_late_answer_never_moves_the_known_position_back() -> None:
    cp = KafkaOffsetCheckpointer(FakeConsumer())
    cp.on_commit(None, [TopicPartition("t", 0, 50)])
    cp.on_commit(None, [TopicPartition("t", 0, 42)])
    assert cp.committed() == {("t", 0): 49}


def test_a_failed_asynchronous_commit_is_logged_not_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cp = KafkaOffsetCheckpointer(FakeConsumer())
    with caplog.at_level(logging.WARNING):
        cp.on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [TopicPartition("t", 0, 42)])
        # librdkafka sets a partition's error; TopicPartition's own is read-only
        failed = SimpleNamespace(
            topic="t", partition=1, offset=7, error=KafkaError(KafkaError.UNKNOWN_MEMBER_ID)
        )
        cp.on_commit(None, [failed, TopicPartition("t", 2, 3)])  # type: ignore[list-item]
    assert cp.committed() == {("t", 2): 2}
    assert "offset commit failed" in caplog.text
    assert "t[1] failed" in caplog.text


def test_a_commit_refused_in_a_rebalance_is_harmless_and_other_errors_raise() -> None:
    consumer = FakeConsumer()
    cp = KafkaOffsetCheckpointer(consumer)
    consumer.fail = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
    cp.commit({("t", 0): 1})
    assert cp.committed() is None
    consumer.fail = KafkaError(KafkaError._TRANSPORT)
    with pytest.raises(KafkaException):
        cp.commit({("t", 0): 1})


def test_nothing_to_commit_sends_nothing() -> None:
    consumer = FakeConsumer()
    KafkaOffsetCheckpointer(consumer).commit({}, wait=False)
    assert consumer.commits == []


def test_a_commit_without_an_answer_fails_at_its_deadline_and_the_client_is_stuck() -> None:
    consumer = FakeConsumer()
    consumer.answer.clear()
    cp = KafkaOffsetCheckpointer(consumer, timeout_s=0.2)
    began = time.monotonic()
    with pytest.raises(NoAnswerError, match=r"within 0\.2 s"):
        cp.commit({("t", 0): 1})
    assert time.monotonic() - began < 5
    assert cp.stuck is not None
    assert cp.committed() is None
    with pytest.raises(NoAnswerError):  # never sent on the stuck client again
        cp.commit({("t", 0): 2})
    assert len(consumer.commits) == 1
    # The close waits for the stuck commit, in the background: the caller goes on.
    close_consumer(consumer, timeout_s=0.2, stuck=cp.stuck)
    assert not consumer.closed.is_set()
    consumer.answer.set()
    assert consumer.closed.wait(10), "the consumer was not closed once its commit ended"


def test_a_close_without_an_answer_does_not_hold_the_caller() -> None:
    consumer = FakeConsumer()
    never = threading.Event()
    consumer.close = lambda: never.wait()  # type: ignore[method-assign]
    began = time.monotonic()
    close_consumer(consumer, timeout_s=0.2)
    assert time.monotonic() - began < 5
    never.set()


def test_a_fourth_stuck_client_in_a_row_is_a_permanent_failure() -> None:
    """Each stuck client is kept until its commit ends: past a few, the process must
    restart rather than pile up clients."""
    deadline = time.monotonic() + 10
    while stuck_clients() and time.monotonic() < deadline:  # another test's, closing
        time.sleep(0.01)
    stuck = [FakeConsumer() for _ in range(MAX_STUCK_CLIENTS + 1)]
    try:
        for consumer in stuck[:MAX_STUCK_CLIENTS]:
            consumer.answer.clear()
            cp = KafkaOffsetCheckpointer(consumer, timeout_s=0.05)
            with pytest.raises(NoAnswerError):
                cp.commit({("t", 0): 1})
            close_consumer(consumer, timeout_s=0.05, stuck=cp.stuck)
        assert stuck_clients() == MAX_STUCK_CLIENTS
        last = stuck[-1]
        last.answer.clear()
        with pytest.raises(PermanentError, match="the process must restart"):
            KafkaOffsetCheckpointer(last, timeout_s=0.05).commit({("t", 0): 1})
    finally:
        for consumer in stuck:
            consumer.answer.set()
    for consumer in stuck[:MAX_STUCK_CLIENTS]:
        assert consumer.closed.wait(10)
    deadline = time.monotonic() + 10
    while stuck_clients() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stuck_clients() == 0


def test_a_commit_deadline_must_fit_in_the_poll_interval() -> None:
    with pytest.raises(ValidationError, match="at most half of max_poll_interval_ms"):
        ConsumerSettings(commit_timeout_s=10, max_poll_interval_ms=10_000)
    assert ConsumerSettings(commit_timeout_s=5, max_poll_interval_ms=10_000).commit_timeout_s == 5
