"""The subscription stream's state machine: the transition table, and the walk through
states a run takes (steps replaced by scripted fakes; the real steps are covered by the
integration and failover e2e tests)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from services.pg2kafka.metrics import Metrics
from services.pg2kafka.postgres import LeaderLock
from services.pg2kafka.replication import SlotInvalidatedError
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.subscriptions import StreamState, SubscriptionStream, next_state
from shared.settings import load_settings

LIVE, QUEUEING, REPLAYING, RECOVERING = (
    StreamState.LIVE, StreamState.QUEUEING, StreamState.REPLAYING, StreamState.RECOVERING,
)  # fmt: skip


def never() -> bool:
    raise AssertionError("Kafka was asked, but the checkpoint alone decides")


@pytest.mark.parametrize(
    ("checkpoint", "kafka", "state"),
    [
        (None, never, LIVE),
        ({"recovering": True, "at": "t"}, never, RECOVERING),
        ({"slot_lsn": "0/1", "at": "t"}, lambda: True, REPLAYING),
        ({"slot_lsn": "0/1", "at": "t"}, lambda: False, QUEUEING),
        ({"recovering": False}, lambda: False, QUEUEING),
    ],
)
def test_the_transition_table(
    checkpoint: Any, kafka: Callable[[], bool], state: StreamState
) -> None:
    assert next_state(checkpoint, kafka) is state


class HeldLock(LeaderLock):
    """A leader lock already held (no database)."""

    def __init__(self) -> None:
        self.released = False

    def check(self, every_s: float) -> None:
        pass

    def release(self) -> None:
        self.released = True


class Scripted(SubscriptionStream):
    """Each step pops its scripted outcome: a next state, None (stopped) or an exception."""

    def __init__(self, start: StreamState, script: dict[StreamState, list[Any]]) -> None:
        settings = load_settings(Pg2KafkaSettings, env_file=None, http={"enabled": False})
        super().__init__(settings, Metrics(CollectorRegistry()), threading.Event())
        self.start = start
        self.script = script
        self.walk: list[StreamState] = []
        self.led: list[bool] = []  # per step: whether it ran holding the leader lock
        self.standby = False

    def where(self) -> StreamState:
        return self.start

    def lead(self) -> LeaderLock | None:
        return None if self.standby else HeldLock()

    def _step(self, state: StreamState) -> StreamState | None:
        self.walk.append(state)
        self.led.append(isinstance(self.leader, HeldLock))
        outcome = self.script[state].pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome  # type: ignore[no-any-return]

    STEPS = {s: (lambda self, s=s: self._step(s)) for s in StreamState}  # noqa: RUF012


def test_an_outage_walks_live_queueing_replaying_live() -> None:
    stream = Scripted(LIVE, {LIVE: [QUEUEING, None], QUEUEING: [REPLAYING], REPLAYING: [LIVE]})
    stream.run_once()
    assert stream.walk == [LIVE, QUEUEING, REPLAYING, LIVE]
    # every state ran as the slot's leader, the replay too (before: without the lock, a
    # second process could replay the same queue or go live during the replay)
    assert stream.led == [True, True, True, True]


def test_a_standby_takes_no_step() -> None:
    stream = Scripted(REPLAYING, {REPLAYING: [LIVE]})
    stream.standby = True  # another process leads; this one was stopped while waiting
    stream.run_once()
    assert stream.walk == []


def test_an_invalidated_slot_in_any_streaming_state_leads_to_recovering() -> None:
    stream = Scripted(
        QUEUEING,
        {QUEUEING: [SlotInvalidatedError("slot lost")], RECOVERING: [REPLAYING],
         REPLAYING: [LIVE], LIVE: [None]},
    )  # fmt: skip
    stream.run_once()
    assert stream.walk == [QUEUEING, RECOVERING, REPLAYING, LIVE]
    assert stream.reason == "slot lost"


def test_a_failure_other_than_an_invalidated_slot_ends_the_run_for_the_retry() -> None:
    stream = Scripted(REPLAYING, {REPLAYING: [RuntimeError("Kafka went away mid-replay")]})
    with pytest.raises(RuntimeError):
        stream.run_once()
    assert stream.walk == [REPLAYING]


def test_a_stopped_stream_takes_no_step() -> None:
    stream = Scripted(LIVE, {})
    stream.stop.set()
    stream.run_once()
    assert stream.walk == []


class FakeCursor:
    def __init__(self, writes: list[int]) -> None:
        self.writes = writes

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def executemany(self, _sql: str, rows: list[Any]) -> None:
        self.writes.append(len(rows))


class FakeConn:
    def __init__(self) -> None:
        self.writes: list[int] = []

    def cursor(self) -> FakeCursor:
        return FakeCursor(self.writes)


def test_queueing_holds_at_most_a_bounded_part_of_a_transaction() -> None:
    """A transaction of 25,000 events used to be held whole in memory before its queue
    rows were written at commit; now in parts of MAX_PENDING."""
    from services.pg2kafka import pgoutput as pg
    from services.pg2kafka.subscriptions import QueueHandler

    handler = QueueHandler.__new__(QueueHandler)
    handler.settings = load_settings(Pg2KafkaSettings, env_file=None, http={"enabled": False})
    handler.pending = []
    handler.queued = 0
    conn = FakeConn()
    handler.queue_conn = conn  # type: ignore[assignment]
    columns = (pg.Column("id", 20, -1, False), pg.Column("created_at", 1184, -1, False))
    rel = pg.Relation(1, "_walcast", "events", "d", columns)

    class Session:
        builder = type("B", (), {"relations": {1: rel}})()

    peak = 0
    for i in range(25_000):
        handler.handle(Session(), 0, pg.Insert(1, (str(i), "2026-01-01 00:00:00+00")))  # type: ignore[arg-type]
        peak = max(peak, len(handler.pending))
    handler.handle(Session(), 0, pg.Commit(0, 0, 0))  # type: ignore[arg-type]
    assert peak <= QueueHandler.MAX_PENDING
    assert sum(conn.writes) == 25_000
    assert handler.queued == 25_000
