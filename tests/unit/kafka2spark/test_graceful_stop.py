"""A stop lets the micro-batch in hand finish (``trigger.stop_grace_s``) before the query
stops — written and committed to Spark's checkpoint: interrupting it cuts
its Delta commit (a log full of Delta's errors) and the batch runs again after the
restart. Only that batch is waited for, not a backlog behind it."""

from __future__ import annotations

from services.kafka2spark.app import finish_batch_in_hand


class Spark:
    """Time that moves only when the stop pauses, and Spark's checkpoint: the last
    committed batch moves to ``done_at[pause]`` after that many pauses."""

    def __init__(self, finished: int, done_at: dict[int, int] | None = None) -> None:
        self.now = 1000.0
        self.pauses = 0
        self.last = finished
        self.done_at = done_at or {}
        self.active = True

    def clock(self) -> float:
        return self.now

    def committed(self, batch: int) -> bool:
        return batch <= self.last

    def pause(self, seconds: float) -> None:
        self.pauses += 1
        self.now += seconds
        self.last = self.done_at.get(self.pauses, self.last)

    def stop(self, in_hand: int | None, grace_s: float = 90) -> bool:
        return finish_batch_in_hand(
            in_hand, self.committed, lambda: self.active, grace_s, self.clock, self.pause
        )


def test_no_batch_yet_stops_at_once() -> None:
    spark = Spark(finished=-1)
    assert spark.stop(None)
    assert spark.pauses == 0


def test_a_batch_already_checkpointed_stops_at_once() -> None:
    spark = Spark(finished=7)
    assert spark.stop(7)
    assert spark.pauses == 0


def test_the_batch_in_hand_finishes_before_the_stop() -> None:
    spark = Spark(finished=6, done_at={25: 7})
    assert spark.stop(7)
    assert spark.pauses == 25  # waited exactly until Spark reported it done


def test_a_backlog_behind_the_batch_in_hand_is_not_waited_for() -> None:
    # batch 7 done after 25 pauses; Spark would go on with 8, 9, ... if waited for
    spark = Spark(finished=6, done_at={25: 7, 50: 8, 75: 9})
    assert spark.stop(7)
    assert spark.pauses == 25


def test_a_batch_longer_than_the_grace_is_interrupted_after_it() -> None:
    spark = Spark(finished=6)
    assert not spark.stop(7, grace_s=5)
    assert 5 <= spark.now - 1000.0 < 5.5


def test_a_query_that_ended_on_its_own_is_not_waited_for() -> None:
    spark = Spark(finished=6)
    spark.active = False
    assert not spark.stop(7)
    assert spark.pauses == 0


def test_a_grace_of_zero_interrupts_at_once() -> None:
    spark = Spark(finished=6, done_at={1: 7})
    assert not spark.stop(7, grace_s=0)
    assert spark.pauses == 0
