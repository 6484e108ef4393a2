"""One table's verification, in rounds (docs/design.md#verification), and its report.

Round 1 reads every range's summary from Postgres, asks for a marker, waits until the sink
applied everything up to it, reads the same summaries from the sink: equal ranges are
done. Each later round looks at the rows of the ranges still open — Postgres first, then
a marker, the wait, the sink — and judges every key (:func:`~shared.verify.core.judge`).
A key the sink holds at a version the read did not see is looked at again next round.
Any other difference is reported only when the next round finds it again with the same
evidence — the sink's version (hash, transaction, edited or not) for a row that differs or is extra,
Postgres's row (hash and xmin) for a missing one, read by a snapshot that sees every
transaction that existed at the previous sink read (a round waits for those to end, up to
``horizon_wait_s``). What is left after the last round is reported as changing, never as
a difference.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from shared.errors import UnverifiableError, WaitExpiredError, classify
from shared.errors import Verdict as RetryVerdict
from shared.failpoints import failpoint
from shared.retry import BackoffPolicy, call_with_retry
from shared.verify.core import (
    Key,
    KeyRange,
    SourceRange,
    Verdict,
    VerifySource,
    VerifyTarget,
    compare_ranges,
    judge_rows,
)

log = logging.getLogger(__name__)


SAMPLE = 10  # keys shown per kind of difference
HORIZON_POLL_S = 0.2  # how often a round waiting for older transactions looks again


@dataclass
class TableReport:
    """What a verification of one table found (``--json`` prints :meth:`as_dict`)."""

    table: tuple[str, str]
    rows: int = 0  # rows Postgres held when its ranges were read
    ranges: int = 0
    looked_into: int = 0  # ranges whose rows were compared
    missing: list[Key] = field(default_factory=list)
    extra: list[Key] = field(default_factory=list)
    differs: list[Key] = field(default_factory=list)
    unknown: list[Key] = field(default_factory=list)  # sink hash unknown, row different or unread
    # of ``differs``: rows another writer changed inside the sink (their hash as written)
    edited: list[Key] = field(default_factory=list)
    changing: list[Key] = field(default_factory=list)  # still changing after the last round
    refused: str = ""  # why the table could not be verified (UnverifiableError), if so
    # Around each difference reported (missing, extra, differs, unknown), the narrowest
    # range holding it: from the key before it that either side held (excluded), to it
    # (included). What ``repair`` asks pg2kafka to read again.
    around: dict[Key, KeyRange] = field(default_factory=dict)
    rounds: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Nothing differs. Rows still changing are not a difference; rows whose hash the
        sink does not know (an update that left a TOAST value out, rows written before
        the sinks kept hashes) are reported, not judged: a re-snapshot gives them one."""
        return not (self.refused or self.missing or self.extra or self.differs)

    def as_dict(self) -> dict[str, Any]:
        def sample(keys: list[Key]) -> list[Any]:
            return [shown_key(k) for k in keys[:SAMPLE]]

        return {
            "table": ".".join(self.table),
            "ok": self.ok,
            "rows": self.rows,
            "ranges": self.ranges,
            "ranges_looked_into": self.looked_into,
            "rounds": self.rounds,
            **({"refused": self.refused} if self.refused else {}),
            **{
                kind: {"count": len(keys), "sample": sample(keys)}
                for kind, keys in (
                    ("missing", self.missing),
                    ("extra", self.extra),
                    ("differs", self.differs),
                    ("edited_in_sink", self.edited),
                    ("unknown", self.unknown),
                    ("changing", self.changing),
                )
            },
            "elapsed_s": round(self.elapsed_s, 3),
            "rows_per_s": round(self.rows / self.elapsed_s, 1) if self.elapsed_s > 0 else None,
        }


def shown_key(key: Key) -> Any:
    """A key as reports show it: its value, or a list of them for a composite key."""
    return list(map(_plain, key)) if len(key) > 1 else _plain(key[0])


def _plain(v: object) -> Any:
    return v if isinstance(v, (int, str, float)) or v is None else str(v)


@dataclass(frozen=True)
class Plan:
    """How a verification runs (a sink's ``verify`` settings)."""

    range_rows: int = 10_000
    rounds: int = 3  # rounds of looking at rows after the summaries' (at least 2)
    mark_timeout_s: float = 120.0
    slot: str = "walcast"  # pg2kafka's replication slot (the marker is in Kafka once past)
    # a table's verification cut short by a transient failure starts again (None: not)
    retry: BackoffPolicy | None = None
    # how long a round waits for the transactions running at the sink's previous read to
    # end before it reads (a missing row is confirmed only after they have)
    horizon_wait_s: float = 60.0


class Verifier:
    """Runs :meth:`table` with one source, one target and one plan; ``on_range`` is told
    of each range compared (progress)."""

    def __init__(
        self,
        source: VerifySource,
        target: VerifyTarget,
        plan: Plan,
        service: str,
        on_range: Callable[[TableReport], None] | None = None,
    ) -> None:
        if plan.rounds < 2:
            raise ValueError("verify needs at least 2 rounds: a missing row is confirmed twice")
        self.source = source
        self.target = target
        self.plan = plan
        self.service = service
        self.on_range = on_range

    def _sync(self, table: tuple[str, str]) -> None:
        """Steps 2 and 3: a marker, and the sink past it."""
        mark_id = f"{self.service}-{uuid.uuid4().hex[:16]}"
        self.target.before_mark([table])
        lsn = self.source.mark(mark_id, [table])
        failpoint("verify.marked")  # the marker committed, the sink not yet past it
        self.source.wait_streamed(self.plan.slot, lsn, self.plan.mark_timeout_s)
        self.target.wait_for_mark(mark_id, [table], self.plan.mark_timeout_s)

    def _synced_at(self, table: tuple[str, str]) -> float:
        """:meth:`_sync`, then when it ended (``time.monotonic()``)."""
        self._sync(table)
        return time.monotonic()

    def table(self, table: tuple[str, str]) -> TableReport:
        """The whole table: every range's summary, then the rows of those that differ.

        The summaries' round asks for the marker first and reads Postgres while the sink
        catches up to it: it only chooses the ranges to look into — equal sums are equal
        whichever side was read first, and a range that differs because one side is
        ahead is looked into like any other. The rounds that judge keys
        (:meth:`_rows`) read Postgres before the marker."""
        report = TableReport(table)
        started = time.monotonic()
        ranges: list[SourceRange] = []
        reading = self.source.ranges(table, self.plan.range_rows)
        first = next(reading, None)  # the table's key checked before a marker is asked for
        with ThreadPoolExecutor(2, thread_name_prefix="verify-mark") as pool:
            synced = pool.submit(self._synced_at, table)
            ahead = pool.submit(self.target.prefetch, table)
            for r in itertools.chain([] if first is None else [first], reading):
                ranges.append(r)
                report.rows += r.summary.rows
                report.ranges += 1
            read_s = time.monotonic() - started
            synced_s = synced.result() - started
            ahead.result()
        sums_started = time.monotonic()
        summaries = self.target.summaries(table, [r.range for r in ranges])
        log.info(
            "%s: %d rows in %d ranges read from Postgres in %.1fs; the sink past the marker"
            " after %.1fs; its summaries read in %.1fs",
            ".".join(table), report.rows, report.ranges, read_s, synced_s,
            time.monotonic() - sums_started,
        )  # fmt: skip
        report.rounds = 1
        differing = [r.range for r in compare_ranges(ranges, summaries)]
        return self._rows(table, differing, report, started, count_rows=False)

    def recheck(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> TableReport:
        """Only ``ranges`` (small: a repair's), compared row by row from the start."""
        report = TableReport(table, ranges=len(ranges))
        return self._rows(table, list(ranges), report, time.monotonic(), count_rows=True)

    def _rows(
        self,
        table: tuple[str, str],
        open_ranges: list[KeyRange],
        report: TableReport,
        started: float,
        *,
        count_rows: bool,
    ) -> TableReport:
        """The rounds that compare the rows of ``open_ranges`` (module docstring);
        ``count_rows``: the report's rows are those the first round reads (a recheck)."""
        around: dict[Key, KeyRange] = {}
        # key -> (verdict, evidence, horizon of that round): a difference seen once, to be
        # seen again with the same evidence before it is reported
        pending: dict[Key, tuple[Verdict, tuple[object, ...], int]] = {}
        final: dict[Key, Verdict] = {}
        edited: dict[Key, bool] = {}  # key -> its confirmed row was edited by another writer
        changing: set[Key] = set()
        for _ in range(self.plan.rounds):
            if not open_ranges:
                break
            report.rounds += 1
            report.looked_into += len(open_ranges)
            missing = [h for v, _, h in pending.values() if v is Verdict.MISSING]
            if missing:
                self._await_horizon(table, max(missing))
            read = [(rng, *self.source.rows(table, rng)) for rng in open_ranges]
            if count_rows:
                report.rows += sum(len(rows) for _, rows, _ in read)
                count_rows = False
            self._sync(table)
            held = [self.target.rows(table, rng) for rng, _, _ in read]
            horizon = self.source.next_xid()  # after the sink's read
            still: list[KeyRange] = []
            seen: dict[Key, tuple[Verdict, tuple[object, ...], int]] = {}
            changing = set()
            for (rng, source_rows, snapshot), sink_rows in zip(read, held, strict=True):
                snap = replace(snapshot, horizon=horizon)
                ours = {r.key: r for r in source_rows}
                theirs = {r.key: r for r in sink_rows}
                again = False
                before_key = rng.lower
                for key, verdict in judge_rows(source_rows, sink_rows, snap):
                    around[key] = KeyRange(before_key, key)
                    before_key = key
                    if verdict is Verdict.EQUAL:
                        final.pop(key, None)
                        continue
                    if verdict is Verdict.CHANGED:
                        changing.add(key)
                        again = True
                        continue
                    if verdict is Verdict.MISSING:
                        src = ours[key]
                        evidence: tuple[object, ...] = (src.hash, src.xmin)
                    else:
                        sink = theirs[key]
                        evidence = (sink.hash, sink.xid, sink.edited)
                    before = pending.get(key)
                    confirmed = before is not None and before[:2] == (verdict, evidence)
                    if confirmed and verdict is Verdict.MISSING:
                        # every transaction that existed when the sink was read last
                        # round is finished in this read: a delete the sink applied then
                        # would show here (docs/design.md#verification)
                        confirmed = before is not None and snap.xmin >= before[2]
                    if confirmed:
                        final[key] = verdict
                        edited[key] = key in theirs and theirs[key].edited
                    else:
                        seen[key] = (verdict, evidence, horizon)
                        again = True
                if again:
                    still.append(rng)
            pending = seen
            open_ranges = still
        changing |= set(pending)
        for key, verdict in final.items():
            if verdict is Verdict.DIFFERS and edited.get(key):
                report.edited.append(key)
            {
                Verdict.MISSING: report.missing,
                Verdict.EXTRA: report.extra,
                Verdict.DIFFERS: report.differs,
                Verdict.UNKNOWN: report.unknown,
            }[verdict].append(key)
            report.around[key] = around[key]
        report.changing = sorted(changing - set(final), key=str)
        report.elapsed_s = time.monotonic() - started
        if self.on_range is not None:
            self.on_range(report)
        return report

    def _await_horizon(self, table: tuple[str, str], xid: int) -> None:
        """Until every transaction below ``xid`` (running at the sink's previous read)
        has ended — the read that confirms a missing row must see them all — or
        ``plan.horizon_wait_s`` passed (the row then stays unconfirmed this round)."""
        deadline = time.monotonic() + self.plan.horizon_wait_s
        oldest = self.source.oldest_xid()
        while oldest < xid:
            if time.monotonic() >= deadline:
                log.info(
                    "verify of %s: transaction %d, older than the sink's last read, still"
                    " running after %g s: the rows missing from the sink stay unconfirmed"
                    " this round", ".".join(table), oldest, self.plan.horizon_wait_s,
                )  # fmt: skip
                return
            time.sleep(HORIZON_POLL_S)
            oldest = self.source.oldest_xid()

    def tables(self, tables: Sequence[tuple[str, str]]) -> list[TableReport]:
        """Each table's report; a table that cannot be verified is said so in its report
        (not equal), and the others are verified."""
        return [self.table_or_refusal(t) for t in tables]

    def table_or_refusal(self, table: tuple[str, str]) -> TableReport:
        try:
            if self.plan.retry is None:
                return self.table(table)
            return call_with_retry(
                lambda: self.table(table),
                policy=self.plan.retry,
                what=f"verify {'.'.join(table)}",
                classify_fn=_restartable,
            )
        except UnverifiableError as exc:
            log.error("%s", exc)
            return TableReport(table, refused=str(exc))


def _restartable(exc: BaseException) -> RetryVerdict:
    """Whether a verification cut short by ``exc`` starts again: after a transient failure
    (a lost connection) yes; after a wait that ran out its time, no (the same wait again
    would only double it: the error says what did not progress)."""
    if isinstance(exc, WaitExpiredError):
        return RetryVerdict.PERMANENT
    return classify(exc)
