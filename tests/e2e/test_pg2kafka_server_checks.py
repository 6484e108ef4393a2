"""Permanent server misconfiguration is refused with the fix: a second, throwaway Postgres
cluster with wal_level=replica (the stack's own server is correctly configured)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.e2e.conftest import REPO
from tests.pgcluster import PgCluster


@pytest.fixture
def replica_level_postgres() -> Iterator[int]:
    cluster = PgCluster()
    try:
        cluster.start(wal_level="replica")
        yield cluster.port
    finally:
        cluster.remove()


def test_wal_level_not_logical_is_refused_with_the_fix(
    replica_level_postgres: int, stack_env: dict[str, str]
) -> None:
    env = {
        **os.environ,
        "PG2KAFKA_POSTGRES__HOST": "127.0.0.1",
        "PG2KAFKA_POSTGRES__PORT": str(replica_level_postgres),
        "PG2KAFKA_POSTGRES__USER": "postgres",
        "PG2KAFKA_POSTGRES__DATABASE": "postgres",
        "PG2KAFKA_POSTGRES__PASSWORD": "",
        "PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS": stack_env["WALCAST_KAFKA_BOOTSTRAP"],
    }
    proc = subprocess.run(
        [sys.executable, "-m", "services.pg2kafka", "init"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "wal_level is 'replica'" in proc.stderr
    assert "set wal_level = logical" in proc.stderr
