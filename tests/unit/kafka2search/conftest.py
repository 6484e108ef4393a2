"""What the kafka2search unit tests share."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from services.kafka2search.engines import SearchEngine
from services.kafka2search.settings import Kafka2SearchSettings
from shared.settings import load_settings

SettingsFactory = Callable[..., Kafka2SearchSettings]


@pytest.fixture
def settings_with(monkeypatch: pytest.MonkeyPatch) -> SettingsFactory:
    """Settings from the defaults and the given sections only: no KAFKA2SEARCH_*
    variable of the environment (the local stack's, a developer's) leaks in."""
    for key in list(os.environ):
        if key.upper().startswith("KAFKA2SEARCH_"):
            monkeypatch.delenv(key)

    def make(**sections: Any) -> Kafka2SearchSettings:
        return load_settings(
            Kafka2SearchSettings, env_file=None, http={"enabled": False}, **sections
        )

    return make


class StrictEngine(SearchEngine):
    """A fake engine's base: every call not overridden fails the test, by name (a fake
    that answered None would hide a call the test did not expect)."""

    name = "fake engine"

    def __getattribute__(self, attr: str) -> Any:
        value = object.__getattribute__(self, attr)
        if attr in _ENGINE_CALLS and getattr(type(self), attr) is getattr(SearchEngine, attr):
            raise AssertionError(f"unexpected engine call: {attr}")
        return value


_ENGINE_CALLS = frozenset(
    n for n, v in vars(SearchEngine).items() if callable(v) and not n.startswith("_")
)
