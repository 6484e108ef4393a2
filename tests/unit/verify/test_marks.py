"""GroupMarks.wait_for_mark when a look at the topics finds no copy of the marker: it
looks again until the time allowed, then says the marker is in none of the topics."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from shared.errors import PermanentError, RetriableError
from shared.verify import marks


@pytest.fixture
def group() -> marks.GroupMarks:
    # a consumer that never connects: every Kafka read below is replaced
    g = marks.GroupMarks({"bootstrap.servers": "127.0.0.1:1", "log_level": 0}, "g", ["t"])
    g.applied = lambda: {("t", 0): 10}  # type: ignore[method-assign]
    yield g
    g.consumer.close()


def test_a_marker_found_on_a_later_look_is_waited_for(
    group: marks.GroupMarks, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[int] = []

    def find(*_: Any) -> dict[marks.Partition, int]:
        looks.append(1)
        return {} if len(looks) < 3 else {("t", 0): 7}

    monkeypatch.setattr(marks, "find_marks", find)
    monkeypatch.setattr(marks.time, "sleep", lambda _s: None)
    group.wait_for_mark("sink", "m1", [("s", "t")], timeout_s=60)
    assert len(looks) == 3


def test_a_marker_never_found_is_in_none_of_the_topics(
    group: marks.GroupMarks, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(marks, "find_marks", lambda *_: {})
    monkeypatch.setattr(marks.time, "monotonic", lambda: now[0])

    def sleep(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(marks.time, "sleep", sleep)
    with pytest.raises(PermanentError, match="in none of the topics"):
        group.wait_for_mark("sink", "m1", [("s", "t")], timeout_s=5)
    assert now[0] >= 5  # looked again until the time allowed


def test_a_topic_whose_partitions_cannot_be_read_is_retried_not_empty() -> None:
    """An empty answer from the topic's metadata (an error, a busy broker) would make
    the marker's stretch empty, and every look find nothing: it is retriable."""

    metadata = SimpleNamespace(
        topics={"t": SimpleNamespace(error="LEADER_NOT_AVAILABLE", partitions={})}
    )

    class Consumer:
        def list_topics(self, *_: Any, **__: Any) -> SimpleNamespace:
            return metadata

    with pytest.raises(RetriableError, match="partitions of topic 't'"):
        marks.end_offsets(Consumer(), ["t"])  # type: ignore[arg-type]
