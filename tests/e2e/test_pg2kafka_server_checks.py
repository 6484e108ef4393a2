"""Permanent server misconfiguration is refused with the fix: a second, throwaway Postgres
cluster with wal_level=replica (the stack's own server is correctly configured)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, free_port


@pytest.fixture
def replica_level_postgres() -> Iterator[int]:
    bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))[-1].parent
    root = Path(tempfile.mkdtemp(prefix="walcast-pgtest-"))
    data = root / "data"
    as_owner: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        root.chmod(0o755)
        as_owner = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run(
        [*as_owner, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_owner,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-w",
            "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c wal_level=replica",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield port
    finally:
        subprocess.run(
            [*as_owner, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


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
