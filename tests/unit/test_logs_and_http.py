from __future__ import annotations

import io
import json
import logging
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from shared.http import OpsServer
from shared.logs import SampledLog, bind, configure_logging, register_secret
from shared.secrets import MASK


def test_json_lines_with_extra_fields_and_masked_secret() -> None:
    out = io.StringIO()
    configure_logging("INFO", "json", stream=out)
    register_secret("pa55word-xyz")
    log = bind(logging.getLogger("walcast.test"), slot="s1")
    log.info("connecting with password=pa55word-xyz", extra={"attempt": 2})
    line = json.loads(out.getvalue().strip().splitlines()[-1])
    assert line["msg"] == f"connecting with password={MASK}"
    assert line["slot"] == "s1"
    assert line["attempt"] == 2
    assert line["level"] == "info"
    assert line["logger"] == "walcast.test"


def test_text_format_masks_too() -> None:
    out = io.StringIO()
    configure_logging("DEBUG", "text", stream=out)
    register_secret("another-secret")
    logging.getLogger("x").debug("dsn=host=a password=another-secret", extra={"k": 1})
    text = out.getvalue()
    assert "another-secret" not in text
    assert "k=1" in text


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback http
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_ops_server_endpoints() -> None:
    registry = CollectorRegistry()
    events = Counter("walcast_test_events", "events", registry=registry)
    events.inc(3)
    ready = {"ok": False}
    server = OpsServer(registry, port=0)
    server.add_health_check("loop", lambda: (True, "ticking"))
    server.add_ready_check(
        "kafka", lambda: (ready["ok"], "connected" if ready["ok"] else "not yet")
    )

    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        code, body = _get(base + "/metrics")
        assert code == 200
        assert b"walcast_test_events_total 3.0" in body
        code, body = _get(base + "/health")
        assert code == 200
        assert json.loads(body)["checks"]["loop"] == {"ok": True, "detail": "ticking"}
        code, body = _get(base + "/ready")
        assert code == 503
        assert json.loads(body)["checks"]["kafka"]["detail"] == "not yet"
        ready["ok"] = True
        assert _get(base + "/ready")[0] == 200
        server.add_health_check("broken", broken)
        code, body = _get(base + "/health")
        assert code == 503
        assert "boom" in json.loads(body)["checks"]["broken"]["detail"]
        assert _get(base + "/nope")[0] == 404
        # the checks as metrics: what the endpoints answer, per readiness check too
        metrics = _get(base + "/metrics")[1].decode()
        assert "walcast_ready 1.0" in metrics
        assert "walcast_healthy 0.0" in metrics  # the broken check
        assert 'walcast_ready_check{check="kafka"} 1.0' in metrics
        ready["ok"] = False
        assert 'walcast_ready_check{check="kafka"} 0.0' in _get(base + "/metrics")[1].decode()
    finally:
        server.stop()


def test_a_slow_check_never_makes_a_scrape_slow() -> None:
    """A readiness check that asks a dependency (kafka2search pings its engine) may take
    its request timeout: a scrape reports the last finished evaluation instead of
    waiting (Prometheus would time out and call the service down)."""
    registry = CollectorRegistry()
    server = OpsServer(registry, port=0)
    slow = {"s": 0.0}

    def engine() -> tuple[bool, str]:
        time.sleep(slow["s"])
        return True, "answers"

    server.add_ready_check("engine", engine)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert "walcast_ready 1.0" in _get(base + "/metrics")[1].decode()
        slow["s"] = 4.0
        started = time.monotonic()
        body = _get(base + "/metrics")[1].decode()
        assert time.monotonic() - started < 3.0
        assert "walcast_ready 1.0" in body  # the last finished evaluation
    finally:
        slow["s"] = 0.0
        server.stop()


@pytest.fixture(autouse=True)
def _restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_flood_of_warnings_is_a_sample_and_a_rate(caplog: pytest.LogCaptureFixture) -> None:
    """779,071 dead-letter lines in five minutes of one run: a flood is logged as the
    first few in full, then one summary per window with the count, rate and reasons."""
    now = [0.0]
    logger = logging.getLogger("walcast.test.sampled")
    sampled = SampledLog(logger, "dead letters", sample=3, every_s=10, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="walcast.test.sampled"):
        for i in range(100_000):
            sampled.warning("no document id" if i % 4 else "refused", "dead letter %d", i)
        assert len(caplog.records) == 4  # three in full, and a note that the rest are counted
        shown = [r.getMessage() for r in caplog.records[:3]]
        assert shown == [f"dead letter {i}" for i in range(3)]
        now[0] = 12.0
        sampled.tick()
        summary = caplog.records[-1].getMessage()
        assert summary.startswith("99997 more dead letters in the last 12s (8333.1/s)")
        assert "74998 x no document id" in summary
        sampled.tick()  # nothing new: no line
        assert len(caplog.records) == 5
        sampled.warning("refused", "dead letter %d", 1)  # a new window shows in full again
        assert caplog.records[-1].getMessage() == "dead letter 1"
