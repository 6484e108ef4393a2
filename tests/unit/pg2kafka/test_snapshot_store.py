"""The snapshot store's contract (tests/snapshot_store_contract.py) on the in-memory
store; the Postgres store is held to the same checks in
tests/integration/pg2kafka/test_snapshot_store.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.pg2kafka.snapshots.memory import InMemorySnapshotStore
from shared.errors import PermanentError, RetriableError
from tests.snapshot_store_contract import CHECKS, Stores


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_in_memory_store_keeps_the_contract(check: Callable[[Stores], None]) -> None:
    shared = InMemorySnapshotStore()
    check(Stores(open=lambda: shared, slot="contract"))


def test_the_slot_positions_and_their_failures() -> None:
    store = InMemorySnapshotStore({"live": 1234, "invalidated": None})
    assert store.restart_lsn("live") == 1234
    assert store.slot_exists("live")
    assert not store.slot_exists("gone")
    with pytest.raises(RetriableError, match="is gone"):
        store.restart_lsn("gone")
    with pytest.raises(PermanentError, match="invalidated"):
        store.restart_lsn("invalidated")
