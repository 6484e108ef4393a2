"""The comparison of shared/verify/core.py: a snapshot's visibility of the 32-bit
transaction ids events carry (across an epoch boundary too), the verdict on one key for
every combination the design names (docs/design.md#verification), and which ranges are
looked into."""

from __future__ import annotations

import pytest

from shared.verify.core import (
    KeyRange,
    SinkRow,
    Snapshot,
    SourceRange,
    SourceRow,
    Summary,
    Verdict,
    compare_ranges,
    judge,
    judge_rows,
)

S = Snapshot.parse("1000:1010:1003,1007")


@pytest.mark.parametrize(
    ("xid", "seen"),
    [(999, True), (1000, True), (1003, False), (1005, True), (1007, False), (1010, False),
     (1500, False), (0, True), (2, True)],
)  # fmt: skip
def test_a_snapshot_sees_what_committed_before_it(xid: int, seen: bool) -> None:
    assert S.sees(xid) is seen


def test_32_bit_ids_are_placed_in_the_snapshots_epoch() -> None:
    # xmax just past an epoch boundary: ids near 2^32 belong to the epoch before
    s = Snapshot.parse(f"{(1 << 32) + 5}:{(1 << 32) + 20}:{(1 << 32) + 8}")
    assert s.full(4_294_967_000) == 4_294_967_000
    assert s.sees(4_294_967_000)  # the previous epoch: long finished
    assert s.sees(5)
    assert s.sees(19)
    assert not s.sees(8)  # in progress
    assert not s.sees(20)  # not begun
    # just before a boundary, ids just past it (written after the snapshot) are later
    t = Snapshot.parse(f"{(1 << 32) - 10}:{(1 << 32) - 5}:")
    assert t.full(3) == (1 << 32) + 3
    assert not t.sees(3)
    assert t.sees(4_294_967_285)


def test_a_snapshot_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not a snapshot"):
        Snapshot.parse("12:13")


K = (7,)


@pytest.mark.parametrize(
    ("source", "sink", "verdict"),
    [
        (SourceRow(K, 5, 1001), SinkRow(K, 5, 1001), Verdict.EQUAL),
        # equal content, whoever wrote it
        (SourceRow(K, 5, 1001), SinkRow(K, 5, 1500), Verdict.EQUAL),
        # the sink is ahead of the read: look again
        (SourceRow(K, 5, 1001), SinkRow(K, 6, 1500), Verdict.CHANGED),
        (SourceRow(K, 5, 1001), SinkRow(K, 6, 1003), Verdict.CHANGED),
        (None, SinkRow(K, 6, 1007), Verdict.CHANGED),
        # the sink holds a version the read saw, or older: it should hold the read's
        (SourceRow(K, 5, 1001), SinkRow(K, 6, 999), Verdict.DIFFERS),
        (SourceRow(K, 5, 1001), SinkRow(K, 6, 0), Verdict.DIFFERS),  # a read row
        (None, SinkRow(K, 6, 999), Verdict.EXTRA),
        (None, SinkRow(K, 6, 0), Verdict.EXTRA),  # a document added behind walcast's back
        (SourceRow(K, 5, 1001), None, Verdict.MISSING),
        (SourceRow(K, 5, 1001), SinkRow(K, None, 999), Verdict.UNKNOWN),
        (SourceRow(K, 5, 1001), SinkRow(K, None, 1500), Verdict.CHANGED),
    ],
)
def test_the_verdict_on_one_key(
    source: SourceRow | None, sink: SinkRow | None, verdict: Verdict
) -> None:
    assert judge(source, sink, S) is verdict


def test_every_key_of_either_side_is_judged_in_key_order() -> None:
    source = [SourceRow((1,), 10, 999), SourceRow((2,), 20, 999), SourceRow((10,), 1, 999)]
    sink = [SinkRow((10,), 1, 999), SinkRow((2,), 21, 999), SinkRow((3,), 30, 999)]
    got = list(judge_rows(source, sink, S))
    assert got == [((1,), Verdict.MISSING), ((2,), Verdict.DIFFERS), ((3,), Verdict.EXTRA),
                   ((10,), Verdict.EQUAL)]  # fmt: skip


def test_ranges_whose_summaries_differ_are_looked_into() -> None:
    r = [SourceRange(KeyRange(None, (10,)), Summary(10, 100), S),
         SourceRange(KeyRange((10,), (20,)), Summary(10, 200), S),
         SourceRange(KeyRange((20,), None), Summary(3, 7), S)]  # fmt: skip
    sink = [Summary(10, 100), Summary(10, 201), Summary(3, 7, unknown=1)]
    assert compare_ranges(r, sink) == r[1:]
    assert str(r[0].range) == "(, 10]"
    assert str(r[2].range) == "(20, )"
    with pytest.raises(ValueError, match="3 source ranges, 2 sink summaries"):
        compare_ranges(r, sink[:2])
