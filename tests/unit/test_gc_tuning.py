"""tune_gc_for_records: the collector set up once per process for a record loop."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from shared import cli


@pytest.fixture
def fresh_process_gc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As if no service had started in this process; the collector restored after."""
    threshold = gc.get_threshold()
    monkeypatch.setattr(cli, "_gc_tuned", False)
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_start_up_heap_frozen_and_young_generation_enlarged(fresh_process_gc: None) -> None:
    before = [1, 2]  # tracked by the collector
    cli.tune_gc_for_records()
    after = [3, 4]
    seen = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
    assert id(before) not in seen  # frozen: no collection looks at it again
    assert id(after) in seen
    assert gc.get_threshold() == (10_000, 20, 20)


def test_only_the_first_call_in_a_process_freezes(fresh_process_gc: None) -> None:
    cli.tune_gc_for_records()
    kept = [1, 2]  # allocated after the first call
    cli.tune_gc_for_records()
    seen = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
    assert id(kept) in seen  # not frozen by the second call
