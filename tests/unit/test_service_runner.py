"""shared.service.Runner: the process around every service's work."""

from __future__ import annotations

import threading
import urllib.request

import pytest

from shared.service import Runner
from shared.settings import HttpSettings


def test_the_first_failure_stops_the_others_and_is_raised_after_cleanup() -> None:
    runner = Runner(HttpSettings(enabled=False))
    order: list[str] = []

    def main() -> None:
        runner.stop_event.wait(30)  # runs until something stops it
        order.append("main stopped")

    def failing() -> None:
        raise RuntimeError("the side work failed")

    with pytest.raises(RuntimeError, match="side work failed"):
        runner.run(main, beside=[("side", failing)], cleanup=lambda: order.append("cleanup"))
    assert order == ["main stopped", "cleanup"]
    assert runner.stop_event.is_set()


def test_a_stop_ends_every_part_and_serves_the_ops_endpoint_meanwhile() -> None:
    runner = Runner(HttpSettings(enabled=True, port=0))
    runner.ready("work", lambda: (True, "working"))
    seen: list[int] = []
    started = threading.Event()

    def main() -> None:
        started.set()
        runner.stop_event.wait(30)

    def probe() -> None:
        started.wait(10)
        assert runner.ops is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{runner.ops.port}/ready", timeout=5) as r:
            seen.append(r.status)
        runner.stop()

    runner.run(main, beside=[("probe", probe)])
    assert seen == [200]
