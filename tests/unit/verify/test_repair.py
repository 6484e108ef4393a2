"""``repair`` (shared/verify/repair.py) with the verification fakes of test_rounds and a fake
pipeline that implements the repair protocol: a request reads its key ranges again — every
source row in them lands in the sink, every sink row in them the source lacks goes (the
range end marker), nothing outside them changes. Checked: an equal table asks for
nothing; the ranges asked for hold exactly the differing keys; what was repaired is
reported by kind; a key the sink keeps at a newer version is read again in a later
attempt; a request pg2kafka declines, or one nobody takes, stops the repair saying so."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from shared.errors import PermanentError, RetriableError
from shared.verify import repair as repair_module
from shared.verify.core import KeyRange
from shared.verify.repair import Repairer, RepairSource, narrow_ranges
from shared.verify.run import Plan, TableReport, Verifier
from tests.unit.verify.test_rounds import HELD, ROWS, FakeSource, FakeTarget, T, within


class FakePipeline(RepairSource):
    """pg2kafka and the sink as ``repair`` sees them."""

    def __init__(self, source: FakeSource, target: FakeTarget, refuse: int = 0) -> None:
        self.source = source
        self.target = target
        self.requests: list[list[KeyRange]] = []
        self.refuse = refuse  # the first N requests leave the sink's newer versions be
        self.state = "done"
        self.newer: set[int] = set()  # keys the sink holds at a version above a read's

    def request_repair(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[int]:
        self.requests.append(list(ranges))
        refusing = len(self.requests) <= self.refuse
        sink = self.target.rows_by_key
        for rng in ranges:
            for k in [k for k in sink if within(rng, (k,))]:
                if k not in self.source.rows_by_key and not (refusing and k in self.newer):
                    del sink[k]  # the range end marker: older than the run, not in the source
            for k, h in self.source.rows_by_key.items():
                if within(rng, (k,)) and not (refusing and k in self.newer):
                    sink[k] = (h, 0)  # a read row
        return [len(self.requests)]

    def repair_progress(self, ids: Sequence[int]) -> list[tuple[int, str, str, int, int]]:
        return [(i, "walcast", self.state, 1, 1) for i in ids]


def setup(
    source: dict[int, int], sink: dict[int, tuple[int | None, int]], refuse: int = 0
) -> tuple[Repairer, FakePipeline]:
    log: list[str] = []
    target = FakeTarget(sink, log)
    src = FakeSource(source, log)
    target.source = src
    pipeline = FakePipeline(src, target, refuse)
    verifier = Verifier(src, target, Plan(range_rows=10), "test")
    return Repairer(verifier, pipeline, timeout_s=1.0), pipeline


def test_an_equal_table_asks_for_nothing() -> None:
    repairer, pipeline = setup(dict(ROWS), dict(HELD))
    report = repairer.table(T)
    assert report.ok
    assert report.after is None
    assert report.attempts == 0
    assert pipeline.requests == []


def test_the_ranges_read_again_hold_exactly_the_differing_keys_and_are_repaired() -> None:
    sink = dict(HELD)
    del sink[7]  # missing
    sink[31] = (5, 50)  # extra, beyond the last key
    sink[12] = (1, 50)  # differs
    sink[13] = (2, 50)  # differs, next to 12: one range
    sink[20] = (None, 50)  # unknown hash
    repairer, pipeline = setup(dict(ROWS), sink)
    report = repairer.table(T)
    assert report.ok, report.as_dict()
    assert report.attempts == 1
    (asked,) = pipeline.requests
    every_key = set(ROWS) | set(sink) | {31}
    inside = {k for k in every_key for rng in asked if within(rng, (k,))}
    assert inside == {7, 12, 13, 20, 31}
    assert KeyRange((11,), (13,)) in asked  # adjacent differences joined
    d = report.as_dict()
    assert {kind: v["sample"] for kind, v in d["repaired"].items()} == {
        "missing": [7], "extra": [31], "differs": [12, 13], "unknown": [20]
    }  # fmt: skip
    assert pipeline.target.rows_by_key == HELD | {k: (ROWS[k], 0) for k in (7, 12, 13, 20)}


def test_a_key_held_at_a_newer_version_is_read_again_in_a_later_attempt() -> None:
    sink = dict(HELD)
    sink[4] = (9, 50)
    repairer, pipeline = setup(dict(ROWS), sink, refuse=1)
    pipeline.newer = {4}
    report = repairer.table(T)
    assert report.ok, report.as_dict()
    assert report.attempts == 2
    assert len(pipeline.requests) == 2
    assert report.as_dict()["repaired"]["differs"]["sample"] == [4]


def test_a_key_still_different_after_every_attempt_is_reported() -> None:
    sink = dict(HELD)
    sink[4] = (9, 50)
    repairer, pipeline = setup(dict(ROWS), sink, refuse=9)
    pipeline.newer = {4}
    report = repairer.table(T)
    assert not report.ok
    assert report.attempts == 3
    assert report.after is not None
    assert report.after.differs == [(4,)]


def test_a_declined_request_stops_with_what_to_check() -> None:
    sink = dict(HELD)
    del sink[3]
    repairer, pipeline = setup(dict(ROWS), sink)
    pipeline.state = "declined"
    with pytest.raises(PermanentError, match="declined the request"):
        repairer.table(T)


def test_a_request_nobody_takes_stops_without_waiting_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(repair_module, "POLL_S", 0.01)
    sink = dict(HELD)
    del sink[3]
    repairer, pipeline = setup(dict(ROWS), sink)
    pipeline.state = "waiting"
    repairer.timeout_s = 0.1
    with pytest.raises(RetriableError, match="no pg2kafka took it"):
        repairer.table(T)


def test_narrow_ranges_join_neighbours_and_keep_key_order() -> None:
    report = TableReport(T)
    report.missing = [(9,), (3,)]
    report.extra = [(4,)]
    report.around = {(3,): KeyRange((2,), (3,)), (4,): KeyRange((3,), (4,)),
                     (9,): KeyRange((8,), (9,))}  # fmt: skip
    assert narrow_ranges(report) == [KeyRange((2,), (4,)), KeyRange((8,), (9,))]
