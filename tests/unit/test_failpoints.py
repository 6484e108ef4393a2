"""Failpoints (shared/failpoints.py): what a test may arm, and the ``term`` action — a
stop asked at that very moment, through the service's own signal handling."""

from __future__ import annotations

import signal
from types import FrameType

import pytest

from shared import failpoints
from shared.failpoints import ENV, FailpointError, failpoint


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Failpoints read again from the environment, no place hit yet."""
    monkeypatch.setattr(failpoints, "_armed", None)
    monkeypatch.setattr(failpoints, "_hits", {})
    return monkeypatch


def test_actions_and_counts_parse_and_anything_else_is_refused() -> None:
    assert failpoints._parse("a.b=exit@3; c.d=raise ;e.f=term") == {
        "a.b": ("exit", 3), "c.d": ("raise", 1), "e.f": ("term", 1),
    }  # fmt: skip
    for bad in ("a.b=boom", "a.b", "a.b=exit@x"):
        with pytest.raises(ValueError, match=r"exit\|raise\|term"):
            failpoints._parse(bad)


def test_term_sends_this_process_sigterm_once_and_goes_on(armed: pytest.MonkeyPatch) -> None:
    armed.setenv(ENV, "place.one=term@2")
    got: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        got.append(signum)

    before = signal.signal(signal.SIGTERM, handler)
    try:
        failpoint("place.one")
        assert got == []  # armed for the second time the place is reached
        failpoint("place.one")  # returns: the process goes on
        assert got == [signal.SIGTERM]
        failpoint("place.one")
        assert got == [signal.SIGTERM]  # a place fires once per process
    finally:
        signal.signal(signal.SIGTERM, before)


def test_raise_fails_through_the_callers_own_error_path(armed: pytest.MonkeyPatch) -> None:
    armed.setenv(ENV, "place.two=raise")
    with pytest.raises(FailpointError, match=r"place\.two"):
        failpoint("place.two")
    failpoint("place.other")  # places not armed cost nothing
