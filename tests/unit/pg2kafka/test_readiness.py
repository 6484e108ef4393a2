"""pg2kafka's /ready and role: a leader streaming or reading its initial snapshot and a
connected standby are ready (a Kubernetes rolling update waits for new pods, which start
as standbys); a process between attempts, or a standby that stopped polling, is not."""

from __future__ import annotations

import time

from services.pg2kafka.app import events_readiness, readiness
from services.pg2kafka.session import Liveness


def test_leader_streaming_or_snapshotting_is_ready() -> None:
    live = Liveness(streaming=True, leading=True)
    assert readiness(live, 10) == (True, "leader: replication streaming")
    live = Liveness(leading=True, snapshotting=True)
    assert readiness(live, 10)[0]
    assert "snapshot" in readiness(live, 10)[1]


def test_a_leader_between_attempts_is_not_ready() -> None:
    # leading (holds the lock) but neither streaming nor snapshotting: a session starting
    # over after a failure
    assert not readiness(Liveness(leading=True), 10)[0]
    assert not readiness(Liveness(), 10)[0]


def test_a_standby_is_ready_while_it_polls_the_lock() -> None:
    live = Liveness()
    live.standing_by()
    assert readiness(live, 10) == (True, "standby: another pg2kafka leads the slot")
    assert live.standby(10)
    live.standby_at = time.monotonic() - 30  # its connection died: no round for 30 s
    assert not readiness(live, 10)[0]
    live.standing_by()
    live.leading = True  # took over: a leader, not a standby any more
    assert not live.standby(10)


def test_the_events_stream_is_ready_in_every_state_it_leads_and_as_a_standby() -> None:
    live = Liveness(leading=True)  # queueing or replaying: not streaming, still working
    assert events_readiness(live, 10)[0]
    standby = Liveness()
    assert not events_readiness(standby, 10)[0]
    standby.standing_by()
    assert events_readiness(standby, 10)[0]
