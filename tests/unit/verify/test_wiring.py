"""How a sink runs ``verify`` (shared/verify/wiring.py): ``verify`` of a sink fed Debezium
records reads Postgres's text as pg2kafka's Debezium format does (money under
``lc_monetary=C``), so that the row hashes agree."""

from __future__ import annotations

import pytest

from shared.settings import VerifySettings
from shared.verify.wiring import _source


@pytest.mark.parametrize(("input_format", "monetary"), [
    ("debezium", True), ("walcast", False), ("auto", False),
])  # fmt: skip
def test_verify_reads_money_as_the_format_it_checks_does(input_format: str, monetary: bool) -> None:
    source, _shape = _source(VerifySettings(), input_format)
    assert ("lc_monetary=C" in source.options) is monetary
    assert "DateStyle=ISO" in source.options  # the text-output settings stay
