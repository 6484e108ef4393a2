"""The local stack's files that guard secrets: the env file (passwords) is 0600 from the
moment it exists; Postgres's socket admits only the server's OS user, and no local line
of pg_hba.conf trusts anyone. An existing installation is brought up to the same."""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.stack_module import load_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    module = load_stack(tmp_path, monkeypatch)
    old = os.umask(0o022)  # a usual umask: files would be world-readable by default
    try:
        yield module
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_env_file_is_created_0600_without_a_chmod(
    stack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_chmod(*_: object, **__: object) -> None:
        raise AssertionError("the env file must be created with its mode, not chmod-ed")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    assert stack.write_env_file([stack.Postgres()]) is True
    env = tmp_path / "walcast.env"
    assert _mode(env) == 0o600
    assert "PG2KAFKA_POSTGRES__PASSWORD=" in env.read_text()
    assert stack.write_env_file([stack.Postgres()]) is False  # same content: untouched
    assert stack.write_env_file([]) is True  # new content replaces the file, still 0600
    assert _mode(env) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["walcast.env"]  # no temporary left


def test_an_existing_env_file_readable_by_others_is_fixed(stack: Any, tmp_path: Path) -> None:
    env = tmp_path / "walcast.env"
    env.write_text("WALCAST_PG_PASSWORD=walcast\n")
    env.chmod(0o644)
    assert stack.fix_env_file_mode() == ["env file mode"]
    assert _mode(env) == 0o600
    assert stack.fix_env_file_mode() == []


def test_pg_hba_trusts_nobody_and_peer_is_for_the_owner_as_postgres(stack: Any) -> None:
    lines = [ln.split() for ln in stack.pg_hba().splitlines() if ln and not ln.startswith("#")]
    assert not [ln for ln in lines if "trust" in ln]
    local = [ln for ln in lines if ln[0] == "local"]
    assert local[0] == ["local", "all", "postgres", "peer", f"map={stack.base.PG_IDENT_MAP}"]
    assert all(ln[-1] == "scram-sha-256" for ln in local[1:])
    assert all(ln[0] == "host" and ln[3] == "127.0.0.1/32" for ln in lines if ln[0] != "local")
    assert stack.pg_ident("alice").splitlines()[-1] == f"{stack.base.PG_IDENT_MAP} alice postgres"
    assert stack.base.SOCKET_MODE == 0o700


def test_harden_fixes_an_existing_cluster_once(stack: Any, tmp_path: Path) -> None:
    pg = stack.Postgres()
    pg.data.mkdir(parents=True)
    pg.run_dir.mkdir(parents=True)
    (pg.data / "PG_VERSION").write_text("16\n")
    (pg.data / "postgresql.conf").write_text("# walcast local stack\nport = 55432\n")
    (pg.data / "pg_hba.conf").write_text("local all all trust\nlocal replication all trust\n")
    (pg.data / "pg_ident.conf").write_text("# empty\n")
    sock = socket.socket(socket.AF_UNIX)
    path = pg.run_dir / f".s.PGSQL.{stack.base.PG_PORT}"
    sock.bind(str(path))
    try:
        path.chmod(0o777)
        fixed = pg.harden()  # no server running here: nothing to reload
        assert fixed == [
            "postgres pg_hba.conf",
            "postgres pg_ident.conf",
            "postgres unix_socket_permissions",
            "postgres socket mode",
        ]
        assert (pg.data / "pg_hba.conf").read_text() == stack.pg_hba()
        assert (pg.data / "pg_ident.conf").read_text() == stack.pg_ident(pg.owner())
        assert "\nunix_socket_permissions = 0700\n" in (pg.data / "postgresql.conf").read_text()
        assert _mode(path) == 0o700
        assert pg.harden() == []  # idempotent
    finally:
        sock.close()


def test_the_servers_buffers_follow_the_machines_memory_unless_set_otherwise(
    stack: Any, tmp_path: Path
) -> None:
    pg = stack.Postgres()
    module = sys.modules[type(pg).__module__]
    meminfo, limit = tmp_path / "meminfo", tmp_path / "memory.max"
    limit.write_text("max\n")  # a cgroup without a limit
    for total_kb, mb in ((2 * 2**20, 256), (24 * 2**20, 2048), (512 * 2**10, 128)):
        meminfo.write_text(f"MemTotal:       {total_kb} kB\nMemFree: 1 kB\n")
        assert module.buffers_line(meminfo, (limit,)).startswith(
            f"shared_buffers = {mb}MB  # walcast"
        )
    limit.write_text(f"{4 * 2**30}\n")  # a container limited to 4 GB on a 24-GB host
    meminfo.write_text(f"MemTotal:       {24 * 2**20} kB\n")
    assert module.buffers_line(meminfo, (limit,)).startswith("shared_buffers = 512MB  # walcast")
    assert module.buffers_line(meminfo, (tmp_path / "absent",)).startswith(
        "shared_buffers = 2048MB"
    )
    v1 = tmp_path / "memory.limit_in_bytes"
    v1.write_text("9223372036854771712\n")  # cgroup v1 without a limit
    assert module.buffers_line(meminfo, (tmp_path / "absent", v1)).startswith(
        "shared_buffers = 2048MB"
    )
    v1.write_text(f"{2 * 2**30}\n")
    assert module.buffers_line(meminfo, (tmp_path / "absent", v1)).startswith(
        "shared_buffers = 256MB"
    )
    line = module.buffers_line()
    pg.data.mkdir(parents=True)
    conf = pg.data / "postgresql.conf"
    conf.write_text("# walcast local stack\nshared_buffers = 128MB\nport = 55432\n")  # older
    pg.size_buffers()
    assert conf.read_text() == f"# walcast local stack\n{line}\nport = 55432\n"
    pg.size_buffers()
    assert conf.read_text() == f"# walcast local stack\n{line}\nport = 55432\n"
    conf.write_text("shared_buffers = 512MB\n")  # the operator's own value stays
    pg.size_buffers()
    assert conf.read_text() == "shared_buffers = 512MB\n"


def test_harden_leaves_a_cluster_not_made_yet_alone(stack: Any) -> None:
    assert stack.Postgres().harden() == []
