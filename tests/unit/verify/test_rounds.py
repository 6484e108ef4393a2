"""The rounds of one table's verification (shared/verify/run.py) with fakes of both sides
that implement the real protocols: a table equal to its sink is verified from summaries
alone (no row read from the sink); a missing, an extra and a differing row are each
reported with their key; a row the sink holds ahead of every read (a transaction the
snapshots do not see) is reported as changing, never as a difference; a row missing in one
round and back in the next is no difference; a marker precedes every sink read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from shared.errors import RetriesExhaustedError, UnverifiableError
from shared.retry import BackoffPolicy
from shared.verify.core import (
    KeyRange,
    SinkRow,
    Snapshot,
    SourceRange,
    SourceRow,
    Summary,
    VerifySource,
    VerifyTarget,
)
from shared.verify.marks import MarkNotAppliedError
from shared.verify.run import Plan, Verifier

T = ("app", "t")
SNAP = Snapshot.parse("100:110:105")
AHEAD = -1  # a sink xid standing for "written after every read" (in progress in each)


def snapshot_of_round(r: int) -> Snapshot:
    """Round r's reads: every transaction below 1000 r finished; 1000 r + 5 running."""
    return Snapshot(1000 * r, 1000 * r + 10, frozenset({1000 * r + 5}))


def within(rng: KeyRange, key: tuple[object, ...]) -> bool:
    k = key[0]
    assert isinstance(k, int)
    lo = rng.lower[0] if rng.lower else None
    hi = rng.upper[0] if rng.upper else None
    return (lo is None or k > lo) and (hi is None or k <= hi)  # type: ignore[operator]


class FakeSource(VerifySource):
    def __init__(self, rows: dict[int, int], log: list[str]) -> None:
        self.rows_by_key = rows  # key -> hash
        self.log = log
        self.round = 1

    def _rows(self, rng: KeyRange) -> list[SourceRow]:
        return [SourceRow((k,), h, 99) for k, h in sorted(self.rows_by_key.items())
                if within(rng, (k,))]  # fmt: skip

    def ranges(self, table: tuple[str, str], max_rows: int) -> Iterator[SourceRange]:
        keys = sorted(self.rows_by_key)
        lower = None
        for i in range(0, max(len(keys), 1), max_rows):
            chunk = keys[i : i + max_rows]
            upper = (chunk[-1],) if i + max_rows < len(keys) else None
            rng = KeyRange(lower, upper)
            rows = self._rows(rng)
            yield SourceRange(rng, Summary(len(rows), sum(r.hash for r in rows)), SNAP)
            lower = upper

    def rows(self, table: tuple[str, str], rng: KeyRange) -> tuple[list[SourceRow], Snapshot]:
        self.log.append("source rows")
        if self.long_ended:  # every transaction below the held-back horizons has ended
            x = 1000 * (self.round + 1) + self.held_back + 1000
            return self._rows(rng), Snapshot(x, x + 10, frozenset())
        return self._rows(rng), snapshot_of_round(self.round + 1)

    def mark(self, mark_id: str, tables: Sequence[tuple[str, str]]) -> int:
        self.log.append("mark")
        self.round += 1
        return 1

    def wait_streamed(self, slot: str, lsn: int, timeout_s: float) -> None:
        self.log.append("streamed")

    def next_xid(self) -> int:
        """After the sink's read of this round: the next round's xmin, or (held) not."""
        return 1000 * self.round + 20 + self.held_back

    held_back = 0  # > 1000: a long transaction keeps the next rounds' xmin below it
    long_ends_after: int | None = None  # oldest_xid calls until it ends (None: never)
    long_ended = False

    def oldest_xid(self) -> int:
        self.log.append("oldest xid")
        if self.held_back and not self.long_ended:
            if self.long_ends_after is not None:
                self.long_ends_after -= 1
                self.long_ended = self.long_ends_after <= 0
            if not self.long_ended:
                return 1000 * (self.round + 1)  # the long transaction, below the horizon
        return 1000 * (self.round + 1) + self.held_back + 1000


class FakeTarget(VerifyTarget):
    source: FakeSource

    def __init__(self, rows: dict[int, tuple[int | None, int]], log: list[str]) -> None:
        self.rows_by_key = rows  # key -> (hash, xid)
        self.log = log
        self.rounds: list[dict[int, tuple[int | None, int]]] = []  # per later sink read
        self.edited: set[int] = set()  # keys another writer changed inside the sink
        self.edits_later: list[set[int]] = []  # per later sink read

    def before_mark(self, tables: Sequence[tuple[str, str]]) -> None:
        self.log.append("before mark")

    def wait_for_mark(
        self, mark_id: str, tables: Sequence[tuple[str, str]], timeout_s: float
    ) -> None:
        self.log.append("applied")
        if self.rounds:
            self.rows_by_key = self.rounds.pop(0)
        if self.edits_later:
            self.edited = self.edits_later.pop(0)

    def summaries(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[Summary]:
        self.log.append("sink summaries")
        out = []
        for rng in ranges:
            held = [v for k, v in self.rows_by_key.items() if within(rng, (k,))]
            edited = sum(1 for k in self.edited if k in self.rows_by_key and within(rng, (k,)))
            out.append(Summary(len(held), sum(h for h, _ in held if h is not None),
                               sum(1 for h, _ in held if h is None), edited))  # fmt: skip
        return out

    def rows(self, table: tuple[str, str], rng: KeyRange) -> list[SinkRow]:
        self.log.append("sink rows")
        ahead = 1000 * self.source.round + 5  # in progress in this round's snapshot
        return [SinkRow((k,), h, ahead if x == AHEAD else x, k in self.edited)
                for k, (h, x) in sorted(self.rows_by_key.items()) if within(rng, (k,))]  # fmt: skip


def verify(source: dict[int, int], sink: dict[int, tuple[int | None, int]],
           later: list[dict[int, tuple[int | None, int]]] | None = None, held_back: int = 0,
           edited: set[int] | None = None, edits_later: list[set[int]] | None = None,
           long_ends_after: int | None = None, horizon_wait_s: float = 0.5,
           ) -> tuple[dict[str, object], list[str]]:  # fmt: skip
    log: list[str] = []
    target = FakeTarget(sink, log)
    target.rounds = later or []
    target.edited = edited or set()
    target.edits_later = edits_later or []
    src = FakeSource(source, log)
    src.held_back = held_back
    src.long_ends_after = long_ends_after
    target.source = src
    plan = Plan(range_rows=10, horizon_wait_s=horizon_wait_s)
    report = Verifier(src, target, plan, "test").table(T)
    return report.as_dict(), log


ROWS = {k: 1000 + k for k in range(1, 31)}
HELD = {k: (h, 50) for k, h in ROWS.items()}


def test_an_equal_table_is_verified_from_summaries_alone() -> None:
    report, log = verify(ROWS, dict(HELD))
    assert report["ok"] is True
    assert (report["rows"], report["ranges"], report["ranges_looked_into"]) == (30, 3, 0)
    assert "sink rows" not in log
    assert log.index("applied") < log.index("sink summaries")


def test_missing_extra_and_differing_rows_are_reported_by_key() -> None:
    sink = dict(HELD)
    del sink[4]  # missing
    sink[31] = (7, 50)  # extra (and beyond the last bound: the open range)
    sink[17] = (9, 50)  # differs, written by a transaction the reads see
    sink[25] = (None, 50)  # hash unknown, the row not read again
    report, log = verify(ROWS, sink)
    assert report["ok"] is False
    assert report["missing"] == {"count": 1, "sample": [4]}
    assert report["extra"] == {"count": 1, "sample": [31]}
    assert report["differs"] == {"count": 1, "sample": [17]}
    assert report["unknown"] == {"count": 1, "sample": [25]}  # said, not a difference
    # every sink read follows a marker the sink applied
    for i, entry in enumerate(log):
        if entry.startswith("sink"):
            assert "applied" in log[:i]


def test_a_row_the_sink_holds_ahead_of_every_read_is_changing_not_different() -> None:
    sink = dict(HELD)
    sink[12] = (5, AHEAD)
    report, _ = verify(ROWS, sink)
    assert report["ok"] is True
    assert report["changing"] == {"count": 1, "sample": [12]}


def test_a_row_missing_in_one_round_and_back_in_the_next_is_no_difference() -> None:
    sink = dict(HELD)
    del sink[4]
    report, _ = verify(ROWS, sink, later=[sink, dict(HELD)])
    assert report["ok"] is True
    assert report["missing"]["count"] == 0


def test_fewer_than_two_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 rounds"):
        Verifier(FakeSource({}, []), FakeTarget({}, []), Plan(rounds=1), "test")


def test_unknown_hashes_alone_are_no_difference() -> None:
    sink = dict(HELD)
    sink[25] = (None, 50)
    report, _ = verify(ROWS, sink)
    assert report["ok"] is True
    assert report["unknown"]["count"] == 1


def test_a_missing_row_is_not_confirmed_while_older_transactions_may_still_be_running() -> None:
    """The next read's snapshot must see every transaction that existed when the sink was
    read (a long transaction holds xmin back): until then the row is changing."""
    sink = dict(HELD)
    del sink[4]
    report, _ = verify(ROWS, sink, held_back=5000)
    assert report["ok"] is True
    assert report["missing"]["count"] == 0
    assert report["changing"] == {"count": 1, "sample": [4]}


def test_a_missing_row_waits_for_the_older_transactions_to_end_then_is_reported() -> None:
    """The confirming round waits (polling) for the transactions that were running at
    the sink's previous read, and reads only after they ended."""
    sink = dict(HELD)
    del sink[4]
    report, log = verify(ROWS, sink, held_back=5000, long_ends_after=3, horizon_wait_s=30)
    assert report["missing"] == {"count": 1, "sample": [4]}, report
    assert report["changing"]["count"] == 0
    waited = [i for i, e in enumerate(log) if e == "oldest xid"]
    assert len(waited) == 3, log  # polled until the long transaction ended
    assert log[waited[-1] + 1] == "source rows"  # then the round read


def test_a_row_written_long_ago_is_judged_as_seen_not_as_changing() -> None:
    """An xid 2^31 or more transactions old places beyond the next one: it is old."""
    old = 50_000  # places above every round's xmax, beyond every horizon
    assert not snapshot_of_round(2).sees(old)
    sink = dict(HELD)
    sink[17] = (9, old)
    report, _ = verify(ROWS, sink)
    assert report["differs"] == {"count": 1, "sample": [17]}, report


def test_a_row_edited_inside_the_sink_differs_though_its_hash_is_the_sources() -> None:
    """Another writer changed a value (an engine's _update, a Delta UPDATE): the hash the
    sink keeps is still the source's, the values are not."""
    report, _ = verify(ROWS, dict(HELD), edited={9})
    assert report["ok"] is False
    assert report["differs"] == {"count": 1, "sample": [9]}
    assert report["edited_in_sink"] == {"count": 1, "sample": [9]}
    assert report["ranges_looked_into"] == 2  # seen, then seen again


def test_an_edit_the_sink_service_wrote_over_by_the_next_round_is_no_difference() -> None:
    report, _ = verify(ROWS, dict(HELD), edited={9}, edits_later=[{9}, set()])
    assert report["ok"] is True
    assert report["edited_in_sink"]["count"] == 0


class RefusingSource(FakeSource):
    """Refuses one table as Postgres's side does a table it cannot verify."""

    def ranges(self, table: tuple[str, str], max_rows: int) -> Iterator[SourceRange]:
        if table == ("s", "refused"):
            raise UnverifiableError("verify: s.refused's key column c (numeric) is of a type ...")
        yield from super().ranges(table, max_rows)


def test_a_table_that_cannot_be_verified_is_said_so_and_the_others_are_verified() -> None:
    log: list[str] = []
    target = FakeTarget(dict(HELD), log)
    src = RefusingSource(ROWS, log)
    target.source = src
    reports = Verifier(src, target, Plan(range_rows=10), "test").tables([("s", "refused"), T])
    refused, equal = (r.as_dict() for r in reports)
    assert refused["ok"] is False
    assert "numeric" in refused["refused"]
    assert equal["ok"] is True
    assert "refused" not in equal
    assert log.count("mark") == 1  # no marker asked for the refused table


class RestartingSource(FakeSource):
    """Postgres restarting under the first marker request: the connection is lost."""

    def __init__(self, rows: dict[int, int], log: list[str], failures: list[Exception]) -> None:
        super().__init__(rows, log)
        self.failures = failures

    def mark(self, mark_id: str, tables: Sequence[tuple[str, str]]) -> int:
        if self.failures:
            self.log.append("mark lost")
            raise self.failures.pop(0)
        return super().mark(mark_id, tables)


FAST = BackoffPolicy(initial_s=0.01, max_s=0.01, jitter=0.0, give_up_after_s=5.0)


def test_a_verification_cut_short_by_a_lost_connection_starts_again() -> None:
    log: list[str] = []
    src = RestartingSource(ROWS, log, [ConnectionError("server closed the connection")])
    target = FakeTarget(dict(HELD), log)
    target.source = src
    report = Verifier(src, target, Plan(range_rows=10, retry=FAST), "test").tables([T])[0]
    assert report.as_dict()["ok"] is True
    assert log[:2] == ["before mark", "mark lost"]
    assert log.count("mark") == 1  # a new marker, then the whole table


def test_a_marker_not_reached_in_time_is_not_waited_for_again() -> None:
    log: list[str] = []
    src = RestartingSource(ROWS, log, [MarkNotAppliedError("no progress in 60 s")])
    target = FakeTarget(dict(HELD), log)
    target.source = src
    with pytest.raises(MarkNotAppliedError):
        Verifier(src, target, Plan(range_rows=10, retry=FAST), "test").tables([T])
    assert log.count("mark lost") == 1


def test_a_failure_that_lasts_gives_up_saying_what() -> None:
    log: list[str] = []
    src = RestartingSource(ROWS, log, [ConnectionError("refused")] * 1000)
    target = FakeTarget(dict(HELD), log)
    target.source = src
    policy = BackoffPolicy(initial_s=0.01, max_s=0.01, jitter=0.0, max_attempts=3)
    with pytest.raises(RetriesExhaustedError, match=r"verify app\.t: still failing after 3"):
        Verifier(src, target, Plan(range_rows=10, retry=policy), "test").tables([T])
    assert log.count("mark lost") == 3
