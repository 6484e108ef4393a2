"""Short, deterministic property-based runs over everything a receiver or a record
controls in kafka2webhook (tests/fuzz_webhook_properties.py; bench/fuzz.py runs the same
targets long)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz_webhook_properties import TARGETS, Target

EXAMPLES = {"webhook.exchange": 60}  # real sockets: fewer


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_receiver_and_record_controlled_parsing_is_total(target: Target) -> None:
    run = settings(
        max_examples=EXAMPLES.get(target.name, 300),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )(given(target.strategy)(target.check))
    run()
