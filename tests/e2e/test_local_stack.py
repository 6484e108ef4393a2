"""The local stack's own promises: `up` is idempotent, a dead component is reported and
restored, `down` then `up` keeps Kafka's data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.conftest import REPO, wait_until

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
