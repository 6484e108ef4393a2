"""Which components a stack command acts on: optional ones (Debezium) only when named,
or, for ``down`` and ``status`` without names, while they run."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.stack_module import load_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_stack(tmp_path, monkeypatch)


def names(comps: list[Any]) -> list[str]:
    return [c.name for c in comps]


def test_debezium_is_optional(stack: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack.Debezium, "pid", lambda self: None)
    default = ["postgres", "kafka", "opensearch", "elasticsearch", "spark"]
    assert names(stack.select(None)) == default
    assert names(stack.select(["debezium"])) == ["debezium"]
    assert names(stack.select(["kafka", "debezium"])) == ["kafka", "debezium"]


def test_a_running_optional_component_is_included_without_names(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack.Debezium, "pid", lambda self: 4242)
    assert names(stack.select(None))[-1] == "debezium"
    assert names(stack.select(["postgres"])) == ["postgres"]


def test_an_unknown_component_names_the_known_ones(stack: Any) -> None:
    with pytest.raises(SystemExit, match=r"unknown component\(s\) debezum; known: debezium, "):
        stack.select(["debezum"])


def test_the_env_file_names_debezium_rest_api(stack: Any) -> None:
    assert stack.Debezium().env() == {"WALCAST_DEBEZIUM_URL": "http://127.0.0.1:18083"}
