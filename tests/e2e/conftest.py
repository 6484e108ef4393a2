"""Helpers for e2e tests that run the services as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from services.pg2kafka.settings import Pg2KafkaSettings
from shared.settings import load_settings
from tests.conftest import own_tables

REPO = Path(__file__).resolve().parents[2]


class Proc:
    """One service process (``python -m services.<name> ... run``), output to a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.out = log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", f"services.{name}", *args],
            env={**os.environ, **env},
            stdout=self.out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(30)

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.out.close()

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()


def wait_until(predicate, what: str, timeout: float = 60.0, interval: float = 0.2) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def confirmed(dsn: str, slot: str) -> int:
    """The slot's confirmed_flush_lsn as an integer (0 if the slot is missing or has not
    confirmed anything yet)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [slot],
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0


def pg2kafka_env(name: str, topic: str, partition_key: str | None = None) -> dict[str, str]:
    """Environment of a pg2kafka process streaming slot/publication ``name`` into ``topic``."""
    env = {
        "PG2KAFKA_REPLICATION__SLOT": name,
        "PG2KAFKA_REPLICATION__PUBLICATION": name,
        "PG2KAFKA_PRODUCER__TOPIC": topic,
        "PG2KAFKA_HTTP__PORT": "0",
        "PG2KAFKA_LOG__FORMAT": "text",
        "PG2KAFKA_FILTERS__INCLUDE": json.dumps(own_tables(name)),
    }
    if partition_key is not None:
        env["PG2KAFKA_PRODUCER__PARTITION_KEY"] = partition_key
    return env


def pg2kafka_settings(
    env_file: Path, name: str, topic: str, partitions: int, **sections: Any
) -> Pg2KafkaSettings:
    """pg2kafka streaming slot and publication ``name`` into ``topic`` (created with
    ``partitions``); the stack's env file for the rest, ``sections`` on top."""
    sections.setdefault("filters", {"include": own_tables(name)})
    return load_settings(
        Pg2KafkaSettings,
        env_file=env_file,
        replication={"slot": name, "publication": name},
        producer={"topic": topic, "create_topic": True, "topic_partitions": partitions},
        **sections,
    )


def write_rows(dsn: str, table: str, first: int, n: int, updates: int = 0) -> None:
    """Insert rows ``first`` .. ``first + n - 1`` of an (id, v, pad) table, then update
    each of them ``updates`` times."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {table} SELECT g, 0, repeat('x', 200) FROM generate_series(%s::int,"
            " %s::int) g",
            [first, first + n - 1],
        )
        for _ in range(updates):
            c.execute(f"UPDATE {table} SET v = v + 1 WHERE id BETWEEN %s AND %s",
                      [first, first + n - 1])  # fmt: skip
