"""Retries with backoff, as configuration.

Adapters do not retry by themselves: a caller wraps the adapter call with
:func:`call_with_retry`, which asks :func:`shared.errors.classify` whether a failure is
transient, sleeps according to a :class:`BackoffPolicy`, and gives up with
:class:`~shared.errors.RetriesExhaustedError` when the policy says so. Permanent failures are
re-raised at once, untouched.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from shared.errors import RetriesExhaustedError, Verdict, classify

T = TypeVar("T")
log = logging.getLogger(__name__)


class BackoffPolicy(BaseModel):
    """How long to wait between attempts; ``disabled`` means a single attempt."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: Literal["exponential", "constant", "disabled"] = "exponential"
    """The shape of the waits between attempts at a transient failure; `disabled`: one
    attempt."""
    initial_s: PositiveFloat = 0.2
    """The first wait, in seconds (every wait, with `constant`)."""
    max_s: PositiveFloat = 30.0
    """The longest wait, in seconds."""
    multiplier: float = Field(default=2.0, ge=1.0)
    """Each wait is the previous one times this (`exponential`)."""
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)
    """Each wait varies randomly by up to this fraction of it."""
    max_attempts: int = Field(default=0, ge=0)
    """Attempts before giving up; 0: no limit (`give_up_after_s` bounds the time)."""
    give_up_after_s: float = Field(default=300.0, ge=0.0)
    """Seconds of failing attempts before giving up (the error is then permanent); 0: never
    give up."""

    def delays(self) -> Iterator[float]:
        """Successive waits before attempt 2, 3, ...; ends when attempts are exhausted."""
        if self.kind == "disabled":
            return
        attempt = 1
        delay = self.initial_s
        while self.max_attempts == 0 or attempt < self.max_attempts:
            base = delay if self.kind == "exponential" else self.initial_s
            spread = base * self.jitter
            yield max(0.0, base + random.uniform(-spread, spread))  # noqa: S311 - jitter only
            delay = min(delay * self.multiplier, self.max_s)
            attempt += 1


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: BackoffPolicy,
    what: str,
    classify_fn: Callable[[BaseException], Verdict] = classify,
    sleep: Callable[[float], object] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_retry: Callable[[BaseException, int, float], None] | None = None,
    progressed: Callable[[], bool] | None = None,
) -> T:
    """Call ``fn`` until it succeeds, a failure is permanent, or the policy gives up.

    ``on_retry(exc, attempt, delay)`` runs before each wait (metrics, logs).
    ``progressed()`` is asked after each failure: True means the call did useful work
    before failing (a stream that ran for hours), so the backoff starts over instead of
    counting the hours against ``give_up_after_s``.
    """
    start = clock()
    delays = policy.delays()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            if classify_fn(exc) is Verdict.PERMANENT:
                raise
            if progressed is not None and progressed():
                start, delays, attempt = clock(), policy.delays(), 1
            delay = next(delays, None)
            elapsed = clock() - start
            if delay is None or (
                policy.give_up_after_s and elapsed + delay > policy.give_up_after_s
            ):
                raise RetriesExhaustedError(what, attempt, exc) from exc
            log.warning("%s failed (attempt %d), retrying in %.2fs: %s", what, attempt, delay, exc)
            if on_retry is not None:
                on_retry(exc, attempt, delay)
            sleep(delay)
