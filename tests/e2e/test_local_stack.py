"""The local stack's own promises: `up` is idempotent, a dead component is reported and
restored, `down` then `up` keeps Kafka's data."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import REPO, wait_until
from tests.ports import free_port

WALCAST = str(REPO / "deploy/local/walcast")


def walcast(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [WALCAST, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def status() -> tuple[int, dict[str, dict[str, object]]]:
    proc = walcast("status", "--json")
    doc = json.loads(proc.stdout)
    return proc.returncode, {c["name"]: c for c in doc["components"]}


def test_up_twice_is_a_no_op(stack_env: dict[str, str]) -> None:
    env_file = Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"
    rc, before = status()
    assert rc == 0, before
    mtime = env_file.stat().st_mtime_ns
    proc = walcast("up")
    assert proc.returncode == 0, proc.stderr
    assert "nothing changed" in proc.stdout
    rc, after = status()
    assert rc == 0
    assert {n: c["pid"] for n, c in after.items()} == {n: c["pid"] for n, c in before.items()}
    assert env_file.stat().st_mtime_ns == mtime


def test_killed_component_is_reported_then_restored(stack_env: dict[str, str]) -> None:
    _, before = status()
    pid = before["postgres"]["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)

    def reported_down() -> bool:
        rc, comps = status()
        return rc == 1 and comps["postgres"]["state"] == "stopped"

    wait_until(reported_down, "status to report postgres stopped")
    text = walcast("status")
    assert text.returncode == 1
    assert "postgres" in text.stdout
    assert "log:" in text.stdout  # tells the operator where to look

    proc = walcast("up")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "started: postgres" in proc.stdout
    rc, after = status()
    assert rc == 0, after
    assert after["postgres"]["pid"] != pid


def test_down_then_up_keeps_kafka_topics(stack_env: dict[str, str], unique_name: str) -> None:
    bootstrap = stack_env["WALCAST_KAFKA_BOOTSTRAP"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(unique_name, 1, 1)])[unique_name].result(timeout=30)

    proc = walcast("down", "kafka")
    assert proc.returncode == 0, proc.stderr
    rc, comps = status()
    assert rc == 1
    assert comps["kafka"]["state"] == "stopped"
    assert comps["postgres"]["state"] == "running"  # only what was asked for stopped

    proc = walcast("up")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert unique_name in admin.list_topics(timeout=30).topics
    admin.delete_topics([unique_name])[unique_name].result(timeout=30)


def test_unknown_component_is_rejected() -> None:
    proc = walcast("up", "kafak")
    assert proc.returncode != 0
    assert "unknown component" in proc.stderr + proc.stdout


def test_demo_runs_and_summarises(stack_env: dict[str, str]) -> None:
    proc = walcast("demo", "--rows", "40")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "40/40" in out  # progress reached the end
    assert "demo.customers" in out
    assert "40 rows" in out
    assert "demo.orders" in out
    assert "72 rows" in out  # 80 orders minus every 10th deleted
    assert "walcast.demo.cdc" in out
    assert "walcast.demo.events" in out  # the subscription's notification events
    # kafka2search indexed the CDC topic: each index holds exactly the table's rows
    assert re.search(r"opensearch +walcast-demo\.customers-v1 +40 docs", out), out
    assert re.search(r"opensearch +walcast-demo\.orders-v1 +72 docs", out), out
    assert "0 dead letters" in out
    # kafka2spark mirrored it into Delta: each mirror holds exactly the table's rows
    assert re.search(r"delta +demo\.customers +40 rows", out), out
    assert re.search(r"delta +demo\.orders +72 rows", out), out
    for section in ("kafka", "opensearch", "elasticsearch", "delta"):
        assert f"\n  {section}" in out, section
    # Nothing of the demo's left retaining WAL (guarantee 5): its slots are gone.
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as c:
        left = c.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'walcast_demo%'"
        ).fetchall()
    assert left == [], f"the demo left slots behind: {left}"


@pytest.fixture
def throwaway_stack() -> Iterator[dict[str, str]]:
    """Environment for a second stack (own state directory, own Postgres port): a real
    cluster to make, reconfigure and restart without touching the shared one."""
    root = Path(tempfile.mkdtemp(prefix="walcast-stack-"))
    root.chmod(0o755)  # the postgres OS user must reach its data directory
    env = {**os.environ, "WALCAST_STACK_DIR": str(root), "WALCAST_STACK_PG_PORT": str(free_port())}
    try:
        yield env
    finally:
        subprocess.run([WALCAST, "down", "postgres"], env=env, capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_postgres_socket_and_env_file_guard_the_secrets(throwaway_stack: dict[str, str]) -> None:
    """A new stack: env file 0600, socket 0700, no trust. One made by an older stack (trust
    for all on a 0777 socket, a world-readable env file) is fixed by `up` without a
    restart; the setting holds across one."""
    env = throwaway_stack
    root = Path(env["WALCAST_STACK_DIR"])
    port = env["WALCAST_STACK_PG_PORT"]
    data, sock = root / "postgres/data", root / f"postgres/run/.s.PGSQL.{port}"
    bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1].parent
    as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def up() -> str:
        proc = subprocess.run([WALCAST, "up", "postgres"], env=env, capture_output=True,
                              text=True, timeout=300, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def via_socket(
        user: str, password: str | None, as_user: list[str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        pg_env = {**os.environ, "PGCONNECT_TIMEOUT": "5"}
        pg_env.pop("PGPASSWORD", None)
        if password is not None:
            pg_env["PGPASSWORD"] = password
        return subprocess.run(
            [*(as_user or []), str(bindir / "psql"), "-h", str(sock.parent), "-p", port,
             "-U", user, "-d", "walcast", "-w", "-Atc", "SELECT current_user"],
            env=pg_env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    def secured() -> None:
        assert stat.S_IMODE((root / "walcast.env").stat().st_mode) == 0o600
        assert stat.S_IMODE(sock.stat().st_mode) == 0o700
        assert "trust" not in (data / "pg_hba.conf").read_text()
        assert via_socket("walcast", None).returncode != 0  # no password: refused
        assert via_socket("walcast", "walcast").stdout.strip() == "walcast"
        # the server's OS user, as postgres, without a password: how the stack bootstraps
        assert via_socket("postgres", None, as_owner).stdout.strip() == "postgres"
        if os.geteuid() == 0:  # another OS user cannot even open the socket
            other = via_socket("walcast", "walcast", ["runuser", "-u", "nobody", "--"])
            assert "Permission denied" in other.stderr

    assert "started: postgres" in up()
    secured()
    pid = (data / "postmaster.pid").read_text().split()[0]

    # What an older stack left: trust for everyone on a world-writable socket.
    (data / "pg_hba.conf").write_text("local all all trust\nlocal replication all trust\n"
                                      "host all all 127.0.0.1/32 scram-sha-256\n")  # fmt: skip
    conf = data / "postgresql.conf"
    conf.write_text(conf.read_text().replace("unix_socket_permissions = 0700\n", ""))
    subprocess.run([*as_owner, str(bindir / "pg_ctl"), "-D", str(data), "reload"],
                   check=True, capture_output=True)  # fmt: skip
    sock.chmod(0o777)
    (root / "walcast.env").chmod(0o644)
    assert via_socket("walcast", None).stdout.strip() == "walcast"  # trusted: the old hole

    out = up()
    assert "secured: env file mode, postgres pg_hba.conf, postgres unix_socket_permissions," \
        " postgres socket mode" in out  # fmt: skip
    assert (data / "postmaster.pid").read_text().split()[0] == pid  # reloaded, not restarted
    secured()
    assert "nothing changed" in up()

    proc = subprocess.run([WALCAST, "down", "postgres"], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "started: postgres" in up()  # the stack bootstraps through the socket as before
    secured()


def test_elasticsearch_runs_as_an_unprivileged_user(stack_env: dict[str, str]) -> None:
    """Elasticsearch refuses root: a stack run by root starts it as its own system user,
    the launcher and the server JVM it starts alike."""
    _, comps = status()
    pid = comps["elasticsearch"]["pid"]
    assert isinstance(pid, int)
    session = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == pid:
                    session.append(int(entry.name))
            except ProcessLookupError:
                continue
    assert len(session) >= 2, f"the launcher and the server: {session}"
    uids = set()
    for p in session:
        (line,) = [
            x for x in Path(f"/proc/{p}/status").read_text().splitlines() if x.startswith("Uid:")
        ]
        uids.update(int(u) for u in line.split()[1:])
    expected = pwd.getpwnam("walcast-search").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert uids == {expected}
