"""Choosing the suite's backend (tests/containers.py): the local stack by default,
containers only when asked, and the containers' env file in the stack's own terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.containers import (
    STACK_ONLY,
    BackendError,
    docker_engine,
    env_values,
    select_backend,
    skip_reason,
    stack_module,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_stack_unless_containers_are_asked_for() -> None:
    assert select_backend({}) == "stack"
    assert select_backend({"WALCAST_TEST_BACKEND": ""}) == "stack"
    assert select_backend({"WALCAST_TEST_BACKEND": "stack"}) == "stack"
    assert select_backend({"WALCAST_TEST_BACKEND": " Containers "}) == "containers"
    with pytest.raises(BackendError, match=r"'docker'.*'stack'.*'containers'"):
        select_backend({"WALCAST_TEST_BACKEND": "docker"})


def test_only_tests_of_the_stack_itself_are_skipped_under_containers() -> None:
    assert skip_reason("stack", "tests/e2e/test_local_stack.py") is None
    reason = skip_reason("containers", "/x/tests/e2e/test_local_stack.py")
    assert reason is not None
    assert reason.startswith("needs the local stack")
    assert skip_reason("containers", "tests/e2e/test_chaos.py") is None
    # every name listed is a test module that exists (a rename must not unskip silently)
    modules = {p.name for p in (REPO / "tests").rglob("test_*.py")}
    assert set(STACK_ONLY) <= modules


def test_the_containers_env_file_has_the_stacks_entries() -> None:
    stack = stack_module()
    local = {"WALCAST_STACK_DIR": "/s"}
    for comp in (stack.Postgres(), stack.Kafka(), stack.OpenSearch(), stack.Elasticsearch()):
        local.update(comp.env())
    ours = env_values(Path("/c"), ("10.0.0.5", 32768), "10.0.0.5:32769",
                      "http://10.0.0.5:32770", "http://10.0.0.5:32771")  # fmt: skip
    assert set(ours) == set(local)
    assert ours["WALCAST_PG_DSN"] == "postgresql://walcast:walcast@10.0.0.5:32768/walcast"
    assert ours["PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS"] == "10.0.0.5:32769"
    assert ours["KAFKA2SEARCH_ENGINE__URLS"] == '["http://10.0.0.5:32770"]'


def test_without_an_engine_the_containers_backend_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(BackendError, match="needs a running Docker engine"):
        docker_engine()
