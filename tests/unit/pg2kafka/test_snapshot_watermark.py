"""The delivered-snapshot bookkeeping behind invalidated-slot recovery."""

from __future__ import annotations

from services.pg2kafka.subscriptions import SnapshotWatermark


def test_a_candidate_is_delivered_once_the_handled_position_reaches_it() -> None:
    w = SnapshotWatermark()
    w.offer("s1", 100)
    assert w.passed(99) is None
    assert w.passed(100) == "s1"
    assert w.passed(500) is None  # returned once


def test_the_newest_passed_candidate_wins_and_later_ones_wait() -> None:
    w = SnapshotWatermark()
    for snap, lsn in (("s1", 100), ("s2", 200), ("s3", 300)):
        w.offer(snap, lsn)
    assert w.passed(250) == "s2"
    assert w.passed(299) is None
    assert w.passed(300) == "s3"


def test_a_full_watermark_replaces_its_newest_so_it_never_runs_ahead() -> None:
    w = SnapshotWatermark(limit=2)
    w.offer("s1", 100)
    w.offer("s2", 200)
    w.offer("s3", 300)  # replaces s2: s1 still passes first
    assert w.passed(150) == "s1"
    assert w.passed(250) is None
    assert w.passed(300) == "s3"
