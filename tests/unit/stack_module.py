"""deploy/local/stack.py loaded as a module for unit tests, its state directory moved
under the test's temporary directory (nothing real is touched)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_stack(state: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("walcast_stack", REPO / "deploy/local/stack.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    monkeypatch.setenv("WALCAST_STACK_DIR", str(state))  # read at each use
    return module
