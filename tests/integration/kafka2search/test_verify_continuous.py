"""``verify.interval_s`` inside kafka2search's ``run`` against the real services (on
OpenSearch: the mode is the engine's same requests as ``verify``, which
tests/integration/kafka2search/test_verify.py runs on both engines)."""

from __future__ import annotations

import pytest

from services.kafka2search import admin as search_admin
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2search.conftest import IndexerFactory
from tests.integration.kafka2search.test_verify import pipeline


@pytest.fixture
def engine_kind() -> str:
    return "opensearch"


def test_the_continuous_mode_reports_each_table_in_metrics_and_status(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    """``verify.interval_s`` inside ``run``: the table verified again and again, its
    outcome in ``walcast_verify_*`` and in ``status``; a document deleted behind walcast's
    back turns the next outcome into a difference (what the alert fires on)."""
    schema = f"kc_{unique_name}"
    _h, ix, settings = pipeline(make_harness, make_indexer, schema, interval_s=1)
    name = f"{schema}.t"
    assert ix.service is not None
    registry = ix.service.registry

    def outcome() -> dict[str, object] | None:
        got = [o for o in search_admin.status(settings)["verify"] if o["table"] == name]
        return got[0] if got else None

    ix.wait(lambda: (o := outcome()) is not None and o.get("ok") is True, "an equal outcome")
    assert registry.get_sample_value("walcast_verify_differences", {"table": name}) == 0
    assert (registry.get_sample_value(
        "walcast_verify_last_success_timestamp", {"table": name}) or 0) > 0  # fmt: skip
    ix.es.request("DELETE", f"/{ix.alias('t', schema)}/_doc/5", params={"refresh": "true"})
    ix.wait(lambda: (o := outcome()) is not None and o.get("ok") is False, "a differing outcome",
            timeout=120)  # fmt: skip
    o = outcome()
    assert o is not None
    assert o["missing"] == {"count": 1, "sample": [5]}, o
    assert registry.get_sample_value("walcast_verify_differences", {"table": name}) == 1
