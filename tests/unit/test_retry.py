from __future__ import annotations

import pytest

from shared.errors import PermanentError, RetriableError, RetriesExhaustedError
from shared.retry import BackoffPolicy, call_with_retry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def time(self) -> float:
        return self.now


def flaky(failures: int, exc: Exception) -> tuple[list[int], object]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise exc
        return "ok"

    return calls, fn


def test_exponential_backoff_until_success() -> None:
    clock = Clock()
    calls, fn = flaky(3, RetriableError("down"))
    policy = BackoffPolicy(initial_s=1, multiplier=2, jitter=0, max_s=3)
    result = call_with_retry(fn, policy=policy, what="x", sleep=clock.sleep, clock=clock.time)  # type: ignore[arg-type]
    assert result == "ok"
    assert len(calls) == 4
    assert clock.sleeps == [1, 2, 3]


def test_permanent_error_is_not_retried() -> None:
    clock = Clock()
    calls, fn = flaky(5, PermanentError("bad password", hint="fix it"))
    with pytest.raises(PermanentError):
        call_with_retry(fn, policy=BackoffPolicy(), what="x", sleep=clock.sleep, clock=clock.time)  # type: ignore[arg-type]
    assert len(calls) == 1
    assert clock.sleeps == []


def test_gives_up_after_max_attempts() -> None:
    clock = Clock()
    calls, fn = flaky(10, ConnectionError("refused"))
    policy = BackoffPolicy(max_attempts=3, jitter=0)
    with pytest.raises(RetriesExhaustedError) as info:
        call_with_retry(fn, policy=policy, what="connect", sleep=clock.sleep, clock=clock.time)  # type: ignore[arg-type]
    assert len(calls) == 3
    assert info.value.attempts == 3
    assert "connect" in str(info.value)


def test_gives_up_after_elapsed_time() -> None:
    clock = Clock()
    _, fn = flaky(100, ConnectionError("refused"))
    policy = BackoffPolicy(initial_s=1, multiplier=1, jitter=0, give_up_after_s=5)
    with pytest.raises(RetriesExhaustedError):
        call_with_retry(fn, policy=policy, what="x", sleep=clock.sleep, clock=clock.time)  # type: ignore[arg-type]
    assert sum(clock.sleeps) <= 5


def test_constant_and_disabled() -> None:
    assert list(BackoffPolicy(kind="constant", initial_s=2, jitter=0, max_attempts=4).delays()) == [
        2,
        2,
        2,
    ]
    assert list(BackoffPolicy(kind="disabled").delays()) == []
    clock = Clock()
    calls, fn = flaky(1, RetriableError("x"))
    with pytest.raises(RetriesExhaustedError):
        call_with_retry(
            fn,
            policy=BackoffPolicy(kind="disabled"),
            what="x",  # type: ignore[arg-type]
            sleep=clock.sleep,
            clock=clock.time,
        )
    assert len(calls) == 1


def test_jitter_stays_within_bounds() -> None:
    policy = BackoffPolicy(initial_s=1, multiplier=1, jitter=0.5, max_attempts=50)
    assert all(0.5 <= d <= 1.5 for d in policy.delays())
