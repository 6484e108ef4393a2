"""How a sink runs ``verify`` (shared/verify/wiring.py): a sink fed Debezium records —
which carry no row hash and no verification marker — is refused up front with what to do,
before Postgres or the sink is asked anything: by ``verify``, ``repair`` and the
continuous mode (at the service's start-up)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from shared.errors import ConfigError
from shared.settings import VerifySettings
from shared.verify.continuous import VerifyMetrics
from shared.verify.wiring import repair_once, verify_continuously, verify_once


def no_target(*_: Any) -> Any:
    raise AssertionError("the sink was asked for a target")


def test_verify_of_a_sink_fed_debezium_records_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="Debezium records") as caught:
        verify_once(VerifySettings(), "kafka2search", no_target, [("s", "t")],
                    input_format="debezium")  # fmt: skip
    assert "walcast's format" in (caught.value.hint or "")


def test_repair_of_a_sink_fed_debezium_records_is_refused() -> None:
    with pytest.raises(ConfigError, match="no row hash and no verification marker"):
        repair_once(VerifySettings(), "kafka2spark", no_target, [("s", "t")],
                    input_format="debezium")  # fmt: skip


def test_the_continuous_mode_over_debezium_records_stops_the_start() -> None:
    from prometheus_client import CollectorRegistry

    metrics = VerifyMetrics(CollectorRegistry())
    with pytest.raises(ConfigError, match="input_format = debezium"):
        verify_continuously(VerifySettings(interval_s=5), "kafka2search", no_target,
                            list, metrics, print, threading.Event(),
                            input_format="debezium")  # fmt: skip
    off = verify_continuously(VerifySettings(), "kafka2search", no_target, list, metrics,
                              print, threading.Event(), input_format="debezium")  # fmt: skip
    assert off is None  # off: nothing to refuse
