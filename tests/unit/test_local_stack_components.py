"""Which components a stack command acts on: optional ones (Debezium) only when named,
or, for ``down`` and ``status`` without names, while they run."""

from __future__ import annotations

import subprocess
import sys
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


def test_a_pid_file_naming_another_process_is_not_the_component(stack: Any) -> None:
    """A pid file outlives its process and the number is reused: a live process whose
    command line does not carry the component's state directory is not the component
    (``up`` once tried to start Debezium because its old pid belonged to a new process)."""
    dbz = stack.Debezium()
    dbz.dir.mkdir(parents=True, exist_ok=True)
    others = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ours = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", str(dbz.dir / "marker")]
    )
    try:
        dbz.pid_file.write_text(f"{others.pid}\n")
        assert dbz.pid() is None
        assert names(stack.select(None))[-1] != "debezium"
        dbz.pid_file.write_text(f"{ours.pid}\n")
        assert dbz.pid() == ours.pid
    finally:
        for p in (others, ours):
            p.kill()
            p.wait()


def test_a_start_is_judged_by_its_process_not_by_its_command_line(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after ``Popen`` a child's command line can read empty: the wait for health
    must not call such a process gone (CI once failed a start that went on to succeed)."""
    dbz = stack.Debezium()
    dbz.dir.mkdir(parents=True, exist_ok=True)
    answers = iter([False, False, True])
    monkeypatch.setattr(stack.Debezium, "probe", lambda self: (next(answers), ""))
    monkeypatch.setattr(stack.Debezium, "pid", lambda self: None)  # the empty command line
    starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dbz.pid_file.write_text(f"{starting.pid}\n")
        dbz.wait_healthy()  # returns on the third probe instead of raising
    finally:
        starting.kill()
        starting.wait()


def test_a_process_that_exits_during_start_up_is_reported_with_its_log(
    stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CI run keeps only what was printed: the error quotes the log's last lines."""
    monkeypatch.setattr(stack.Debezium, "probe", lambda self: (False, "refused"))
    dbz = stack.Debezium()
    dbz.dir.mkdir(parents=True, exist_ok=True)
    dbz.log.write_text("starting\njava.net.BindException: Address already in use\n")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dbz.pid_file.write_text(f"{gone.pid}\n")
    with pytest.raises(
        stack.StackError, match=r"(?s)exited during start-up\n.*\| java.net.BindException"
    ):
        dbz.wait_healthy()
