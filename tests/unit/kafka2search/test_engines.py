"""HttpSearchEngine.bulk's reading of a bulk answer (the request goes through a stub
transport; tests/integration/kafka2search/test_engine_bulk.py sends it to the engines)."""

from __future__ import annotations

from typing import Any

import pytest

from services.kafka2search.engines import HttpSearchEngine


class StubTransport:
    """Answers every request with ``answer`` and records what was asked."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []

    def perform_request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.requests.append({"method": method, "path": path, **kwargs})
        return self.answer


class StubClient:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.transport = StubTransport(answer)


def bulk(answer: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, StubTransport]:
    client = StubClient(answer)
    return HttpSearchEngine(client).bulk(b'{"delete":{"_id":"1"}}\n'), client.transport


def test_no_errors_means_no_per_item_results() -> None:
    results, transport = bulk({"errors": False, "items": [{"delete": {"status": 404}}]})
    assert results is None
    (request,) = transport.requests
    assert (request["method"], request["path"]) == ("POST", "/_bulk")
    assert request["params"]["filter_path"] == "errors,items.*.status,items.*.error"


def test_errors_give_the_item_results_in_order() -> None:
    items = [
        {"index": {"status": 201}},
        {"index": {"status": 409, "error": {"type": "version_conflict_engine_exception"}}},
        {"delete": {"status": 404}},
    ]
    results, _ = bulk({"errors": True, "items": items})
    assert results == [
        {"status": 201},
        {"status": 409, "error": {"type": "version_conflict_engine_exception"}},
        {"status": 404},
    ]


@pytest.mark.parametrize("errors", [None, "false", 0], ids=["missing", "string", "zero"])
def test_an_answer_without_a_plain_false_is_read_item_by_item(errors: Any) -> None:
    answer: dict[str, Any] = {"items": [{"index": {"status": 201}}]}
    if errors is not None:
        answer["errors"] = errors
    results, _ = bulk(answer)
    assert results == [{"status": 201}]


class ShardsNotStartedError(Exception):
    """What opensearch-py raises for a search of an index whose shard has not started."""

    status_code = 503


class StartingTransport(StubTransport):
    """Answers the first search with 503 (the index just created), then hits."""

    def perform_request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.requests.append({"method": method, "path": path, **kwargs})
        if path.endswith("/_search") and len(self.requests) == 1:
            raise ShardsNotStartedError("search_phase_execution_exception")
        return self.answer


def test_status_waits_for_the_shard_of_a_just_created_outcomes_index() -> None:
    from services.kafka2search.verify import VERIFY_INDEX, last_outcomes

    client = StubClient({"hits": {"hits": [{"_source": {"report": '{"table": "s.t"}'}}]}})
    client.transport = StartingTransport(client.transport.answer)
    assert last_outcomes(HttpSearchEngine(client), "g") == [{"table": "s.t"}]
    search, health, again = client.transport.requests
    assert health["path"] == f"/_cluster/health/{VERIFY_INDEX}"
    assert health["params"]["wait_for_status"] == "yellow"
    assert search == again
