"""How a sink runs ``verify`` (shared/verify/wiring.py): ``repair`` of a sink fed Debezium
records — a format pg2kafka writes no incremental snapshot in — is refused up front with
what to do, before Postgres or the sink is asked anything; ``verify`` of such a sink
reads Postgres's text as pg2kafka's Debezium format does (money under ``lc_monetary=C``),
so that the row hashes agree."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import ConfigError
from shared.settings import VerifySettings
from shared.verify.wiring import _source, repair_once


def no_target(*_: Any) -> Any:
    raise AssertionError("the sink was asked for a target")


def test_repair_of_a_sink_fed_debezium_records_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match="incremental snapshot") as caught:
        repair_once(VerifySettings(), "kafka2spark", no_target, [("s", "t")],
                    input_format="debezium")  # fmt: skip
    assert "input_format = debezium" in str(caught.value)
    assert "snapshot.mode=initial" in (caught.value.hint or "")


@pytest.mark.parametrize(("input_format", "monetary"), [
    ("debezium", True), ("walcast", False), ("auto", False),
])  # fmt: skip
def test_verify_reads_money_as_the_format_it_checks_does(input_format: str, monetary: bool) -> None:
    source, _shape = _source(VerifySettings(), input_format)
    assert ("lc_monetary=C" in source.options) is monetary
    assert "DateStyle=ISO" in source.options  # the text-output settings stay
