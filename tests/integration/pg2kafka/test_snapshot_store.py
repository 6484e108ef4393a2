"""The snapshot store's contract (tests/snapshot_store_contract.py) on Postgres: each
handle its own connection, as each reader has."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from services.pg2kafka.snapshots.store import PostgresSnapshotStore
from tests.integration.conftest import HarnessFactory
from tests.snapshot_store_contract import CHECKS, Stores


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_postgres_store_keeps_the_contract(
    check: Callable[[Stores], None], make_harness: HarnessFactory
) -> None:
    h = make_harness()  # the migrations, and a slot name unique to the test
    conninfo = h.settings.postgres.conninfo()
    slot = h.settings.replication.slot
    try:
        check(Stores(open=lambda: PostgresSnapshotStore(conninfo), slot=slot))
    finally:
        h.sql("DELETE FROM _walcast.snapshots WHERE slot = %s", [slot])
        h.sql("DELETE FROM _walcast.table_floors WHERE slot = %s", [slot])
