"""Finding a verification marker's copies in Kafka (shared/verify/marks.py): a marker in
none of the topics said with the stretches read; a topic whose partitions cannot be read
retried; a look that reads its stretch to the end; a record holding the id that cannot be
decoded named."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from shared.contract.event import EventDecodeError
from shared.errors import PermanentError, RetriableError
from shared.verify import marks


@pytest.fixture
def group() -> marks.GroupMarks:
    # a consumer that never connects: every Kafka read below is replaced
    g = marks.GroupMarks({"bootstrap.servers": "127.0.0.1:1", "log_level": 0}, "g", ["t"])
    g.applied = lambda: {("t", 0): 10}  # type: ignore[method-assign]
    yield g
    g.consumer.close()


def test_a_marker_in_none_of_the_topics_is_said_with_what_was_read(
    group: marks.GroupMarks, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(marks, "find_marks", lambda *_: marks.Look(stretch={("t", 0): (3, 9)}))
    with pytest.raises(PermanentError, match=r"in none of the topics.*t\[0\] 3\.\.9"):
        group.wait_for_mark("sink", "m1", [("s", "t")], timeout_s=5)


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


class _Msg:
    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class _Partition:
    """One partition of records 0..n-1, read from where assigned; ``position`` answers
    ``stale`` until a record was handed out (a consumer's position from an earlier
    assignment)."""

    def __init__(self, values: list[bytes], stale: int) -> None:
        self.values, self.stale, self.next, self.handed = values, stale, 0, False

    def list_topics(self, *_: Any, **__: Any) -> SimpleNamespace:
        return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions={0: None})})

    def get_watermark_offsets(self, *_: Any, **__: Any) -> tuple[int, int]:
        return 0, len(self.values)

    def assign(self, tps: list[Any]) -> None:
        self.next = tps[0].offset

    def unassign(self) -> None:
        pass

    def consume(self, n: int, _timeout: float) -> list[_Msg]:
        out = [
            _Msg(o, self.values[o]) for o in range(self.next, min(self.next + 2, len(self.values)))
        ]
        self.next += len(out)
        self.handed = self.handed or bool(out)
        return out

    def position(self, tps: list[Any]) -> list[SimpleNamespace]:
        return [SimpleNamespace(offset=self.next if self.handed else self.stale)]


def _mark(mark_id: str) -> bytes:
    return orjson.dumps({"op": "verify", "schema": "s", "table": "t", "verify": {"id": mark_id}})


def test_a_look_reads_its_stretch_to_the_end_and_names_what_it_read() -> None:
    values = [b"{}"] * 5 + [_mark("m1")]
    look = marks.find_marks(_Partition(values, stale=-1), {("t", 0): 1}, "m1", ("s", "t"))  # type: ignore[arg-type]
    assert look.found == {("t", 0): 5}
    assert look.read == {("t", 0): (5, 5)}
    assert look.describe() == "t[0] 1..6 (5 read, last 5)"


def test_a_record_with_the_id_that_cannot_be_decoded_is_named() -> None:
    values = [b"{}", b"\x00\x00\x00\x00\x03m1-avro"]
    consumer = _Partition(values, stale=-1)

    def undecodable(_raw: bytes) -> bytes:
        raise EventDecodeError("schema 3 is not a record")

    look = marks.find_marks(consumer, {("t", 0): 0}, "m1", ("s", "t"), undecodable)  # type: ignore[arg-type]
    assert look.found == {}
    assert look.unreadable == ["t[0]@1: schema 3 is not a record"]
    assert "unreadable: t[0]@1" in look.describe()
