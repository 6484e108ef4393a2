"""A stop lets the micro-batch in hand finish (``trigger.stop_grace_s``) before the query
stops: interrupting it means its Delta commit is cut (a log full of Delta's errors) and
the batch runs again after the restart."""

from __future__ import annotations

import threading

from services.kafka2spark.app import finish_batch_in_hand


class Clock:
    """Time that moves only when the stop pauses; the batch ends after ``ends_after``
    pauses (None: never)."""

    def __init__(self, in_batch: threading.Event, ends_after: int | None) -> None:
        self.now = 1000.0
        self.pauses = 0
        self.in_batch = in_batch
        self.ends_after = ends_after

    def __call__(self) -> float:
        return self.now

    def pause(self, seconds: float) -> None:
        self.pauses += 1
        self.now += seconds
        if self.ends_after is not None and self.pauses >= self.ends_after:
            self.in_batch.clear()


def test_no_batch_in_hand_stops_at_once() -> None:
    in_batch = threading.Event()
    clock = Clock(in_batch, None)
    assert finish_batch_in_hand(in_batch.is_set, lambda: True, 90, clock, clock.pause)
    assert clock.pauses == 0


def test_the_batch_in_hand_finishes_before_the_stop() -> None:
    in_batch = threading.Event()
    in_batch.set()
    clock = Clock(in_batch, ends_after=25)
    assert finish_batch_in_hand(in_batch.is_set, lambda: True, 90, clock, clock.pause)
    assert clock.pauses == 25  # waited exactly until it ended


def test_a_batch_longer_than_the_grace_is_interrupted_after_it() -> None:
    in_batch = threading.Event()
    in_batch.set()
    clock = Clock(in_batch, ends_after=None)
    assert not finish_batch_in_hand(in_batch.is_set, lambda: True, 5, clock, clock.pause)
    assert 5 <= clock.now - 1000.0 < 5.5


def test_a_query_that_ended_on_its_own_is_not_waited_for() -> None:
    in_batch = threading.Event()
    in_batch.set()
    clock = Clock(in_batch, ends_after=None)
    assert not finish_batch_in_hand(in_batch.is_set, lambda: False, 90, clock, clock.pause)
    assert clock.pauses == 0


def test_a_grace_of_zero_interrupts_at_once() -> None:
    in_batch = threading.Event()
    in_batch.set()
    clock = Clock(in_batch, ends_after=1)
    assert not finish_batch_in_hand(in_batch.is_set, lambda: True, 0, clock, clock.pause)
    assert clock.pauses == 0
