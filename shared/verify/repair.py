"""``repair``: make a sink equal its table again where ``verify`` found it different, without
a full re-snapshot (docs/design.md, "Repair").

1. Verify the table (:class:`~shared.verify.run.Verifier`). Around every key found
   missing, extra, different or of unknown hash lies the narrowest range holding it: from
   the key before it that either side held (excluded) to the key (included). Adjacent
   ranges join.
2. Ask pg2kafka to read exactly those ranges again (``_walcast.request_repair``, V021): a
   snapshot of key ranges. Its rows reach the sink as every snapshot's do; its end marker
   (``phase: range_end``) makes the sink remove what it holds in those ranges at an older
   version — rows the source no longer has. Nothing outside the ranges is touched, and
   nothing is written to the sink by this process: the pipeline does it, in order.
3. Wait until pg2kafka reports the run done (every row and the marker acknowledged by
   Kafka), then compare those ranges again, row by row (a marker and the wait for the sink
   included, as in every round of ``verify``).

A key still different afterwards is tried again (``attempts``): a read row carries a
version below every change its read did not see, so a sink holding a key at a version
written after the run started (a document changed behind walcast's back after a recent
change) keeps it until a later read. A key that changes meanwhile is left to the stream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.errors import PermanentError, RetriableError
from shared.failpoints import failpoint
from shared.verify.core import Key, KeyRange
from shared.verify.run import SAMPLE, TableReport, Verifier, shown_key

log = logging.getLogger(__name__)

POLL_S = 0.5


class RepairSource(Protocol):
    """What ``repair`` asks of Postgres besides what ``verify`` does
    (:class:`~shared.verify.postgres.PostgresSource`)."""

    def request_repair(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[int]:
        """File requests to read ``ranges`` of ``table`` again (committed on return): their
        ids, one per publication streaming the table. Bad input raises PermanentError."""
        ...

    def repair_progress(self, ids: Sequence[int]) -> list[tuple[int, str, str, int, int]]:
        """(id, publication, state, chunks done, chunks planned) of each request; state is
        waiting, declined, running, done, cancelled or failed."""
        ...


@dataclass
class RepairReport:
    """What a repair of one table did (``--json`` prints :meth:`as_dict`)."""

    table: tuple[str, str]
    found: TableReport  # the verification that found the differences
    ranges: int = 0  # key ranges read again, over every attempt
    attempts: int = 0
    repaired: dict[str, list[Key]] = field(default_factory=dict)  # kind -> keys now equal
    after: TableReport | None = None  # the last recheck (None: nothing to repair)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Nothing differs any more (or nothing did)."""
        return self.found.ok if self.after is None else self.after.ok

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": ".".join(self.table),
            "ok": self.ok,
            "found": self.found.as_dict(),
            "ranges_read_again": self.ranges,
            "attempts": self.attempts,
            "repaired": {
                kind: {"count": len(keys), "sample": [shown_key(k) for k in keys[:SAMPLE]]}
                for kind, keys in self.repaired.items()
            },
            "after": None if self.after is None else self.after.as_dict(),
            "elapsed_s": round(self.elapsed_s, 3),
        }


def kinds(report: TableReport) -> dict[str, list[Key]]:
    """The keys a repair reads again, by what verify found."""
    return {
        "missing": report.missing,
        "extra": report.extra,
        "differs": report.differs,
        "unknown": report.unknown,
    }


def narrow_ranges(report: TableReport) -> list[KeyRange]:
    """The ranges around the report's differences, adjacent ones joined, in key order."""
    keys = [k for keys in kinds(report).values() for k in keys]
    ranges = sorted((report.around[k] for k in keys if k in report.around), key=_upper_order)
    out: list[KeyRange] = []
    for r in ranges:
        if out and out[-1].upper is not None and out[-1].upper == r.lower:
            out[-1] = KeyRange(out[-1].lower, r.upper)
        else:
            out.append(r)
    return out


def _upper_order(r: KeyRange) -> tuple[int, tuple[tuple[int, int, str], ...]]:
    if r.upper is None:
        return (1, ())
    return (0, tuple((0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in r.upper))


class Repairer:
    """Runs :meth:`table` with a verifier and the Postgres side of requests."""

    def __init__(
        self,
        verifier: Verifier,
        source: RepairSource,
        timeout_s: float,
        attempts: int = 3,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError("repair needs at least 1 attempt")
        self.verifier = verifier
        self.source = source
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.say = on_progress or (lambda _msg: None)

    def table(self, table: tuple[str, str]) -> RepairReport:
        started = time.monotonic()
        found = self.verifier.table_or_refusal(table)
        report = RepairReport(table, found)
        todo = kinds(found)
        ranges = narrow_ranges(found)
        while ranges and report.attempts < self.attempts:
            report.attempts += 1
            report.ranges += len(ranges)
            self.say(
                f"{'.'.join(table)}: reading {len(ranges)} key range(s) again"
                f" (attempt {report.attempts})"
            )
            ids = self.source.request_repair(table, ranges)
            failpoint("repair.requested")  # filed, pg2kafka not yet waited for
            self._wait(table, ids)
            after = self.verifier.recheck(table, ranges)
            report.after = after
            left = {k for keys in kinds(after).values() for k in keys}
            for kind, keys in todo.items():
                fixed = [k for k in keys if k not in left]
                report.repaired.setdefault(kind, []).extend(fixed)
                todo[kind] = [k for k in keys if k in left]
            ranges = narrow_ranges(after)
            if ranges:
                log.info(
                    "repair of %s, attempt %d: still different: %s",
                    ".".join(table), report.attempts,
                    {kind: keys[:SAMPLE] for kind, keys in kinds(after).items() if keys},
                )  # fmt: skip
        report.elapsed_s = time.monotonic() - started
        return report

    def _wait(self, table: tuple[str, str], ids: list[int]) -> None:
        """Until every request's run is done; a request declined or a run that failed
        raises PermanentError, no progress for ``timeout_s`` RetriableError."""
        name = ".".join(table)
        last: list[tuple[int, str, str, int, int]] = []
        moved = time.monotonic()
        while True:
            now = self.source.repair_progress(ids)
            if now != last:
                last, moved = now, time.monotonic()
                done = sum(r[3] for r in now)
                total = sum(r[4] for r in now)
                self.say(f"{name}: read again {done}/{total} chunk(s)")
            states = {r[2] for r in now}
            if states == {"done"}:
                return
            bad = [r for r in now if r[2] in ("declined", "cancelled", "failed")]
            if bad:
                _id, pub, state, _d, _t = bad[0]
                raise PermanentError(
                    f"repair of {name}: pg2kafka {state} the request to read it again"
                    f" (publication {pub})",
                    hint="see pg2kafka's log: is the table still in its publication?",
                )
            if time.monotonic() - moved > self.timeout_s:
                waiting = [r[1] for r in now if r[2] == "waiting"]
                why = (
                    f"no pg2kafka took it (publication(s) {', '.join(waiting)}: is it running?)"
                    if waiting
                    else "its snapshot made no progress"
                )
                raise RetriableError(f"repair of {name}: {why} within {self.timeout_s:.0f}s")
            time.sleep(POLL_S)
