"""The CLI commands and the consume path against a brand-new Kafka broker, started by the
test: a new broker answers group requests with NOT_COORDINATOR /
COORDINATOR_NOT_AVAILABLE until its group coordinator has loaded. The README's demo
failed on its first run on a fresh machine that way (kafka2search status: "Failed to get
committed offsets"); every command must wait such errors out with backoff."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import Producer

from services.pg2kafka import admin
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.settings import load_settings
from tests.conftest import own_tables
from tests.e2e.conftest import REPO, Proc
from tests.integration.conftest import crafted_event
from tests.ports import free_port


def stack_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("walcast_stack", REPO / "deploy/local/stack.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def two_free_ports() -> int:
    """A port whose next port is free too (the broker's controller listens there)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    pytest.fail("no two consecutive free ports")


@pytest.fixture
def fresh_broker(
    stack_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A new single-node broker; yields its bootstrap address as soon as its port accepts
    connections (before any topic or group exists), and removes it afterwards."""
    monkeypatch.setenv("WALCAST_STACK_DIR", stack_env["WALCAST_STACK_DIR"])
    stack = stack_module(monkeypatch)
    port = two_free_ports()
    kafka = stack.Kafka("kafka-fresh", port, home=tmp_path / "kafka-fresh")
    kafka.dir.mkdir(parents=True)
    kafka.install()  # the jars are the stack's (cached); formats new storage
    kafka.start()
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert kafka.pid() is not None, kafka.log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the fresh broker did not open its port"
                time.sleep(0.1)
        yield kafka.bootstrap
    finally:
        kafka.stop()


def cli(service: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"services.{service}", *args],
        env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip


def test_commands_and_consumers_wait_out_a_new_broker(
    fresh_broker: str, stack_env: dict[str, str], unique_name: str, tmp_path: Path
) -> None:
    env_file = str(Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env")
    topic = f"{unique_name}.cdc"
    name = unique_name.replace("_", "-")
    env = {
        "PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS": fresh_broker,
        "PG2KAFKA_REPLICATION__SLOT": unique_name,
        "PG2KAFKA_REPLICATION__PUBLICATION": unique_name,
        "PG2KAFKA_FILTERS__INCLUDE": json.dumps(own_tables(unique_name)),
        "PG2KAFKA_PRODUCER__TOPIC": topic,
        "PG2KAFKA_PRODUCER__CREATE_TOPIC": "true",
        "PG2KAFKA_LOG__FORMAT": "text",
        "KAFKA2SEARCH_KAFKA__BOOTSTRAP_SERVERS": fresh_broker,
        "KAFKA2SEARCH_CONSUMER__TOPICS": json.dumps([topic]),
        "KAFKA2SEARCH_CONSUMER__GROUP_ID": f"{name}-search",
        "KAFKA2SEARCH_CONSUMER__DLQ_TOPIC": f"{name}.dlq",
        "KAFKA2SEARCH_ENGINE__KIND": "opensearch",
        "KAFKA2SEARCH_ENGINE__URLS": json.dumps([stack_env["WALCAST_OPENSEARCH_URL"]]),
        "KAFKA2SEARCH_INDEX__NAME_TEMPLATE": f"{name}-{{table}}",
        "KAFKA2SEARCH_HTTP__PORT": "0",
        "KAFKA2SEARCH_LOG__FORMAT": "text",
        "KAFKA2SPARK_KAFKA__BOOTSTRAP_SERVERS": fresh_broker,
        "KAFKA2SPARK_SOURCE__TOPICS": json.dumps([topic]),
        "KAFKA2SPARK_SOURCE__GROUP_ID": f"{name}-spark",
        "KAFKA2SPARK_DELTA__ROOT": str(tmp_path / "delta"),
        "KAFKA2SPARK_LOG__FORMAT": "text",
    }
    pg: Pg2KafkaSettings = load_settings(
        Pg2KafkaSettings, env_file=Path(env_file),
        replication={"slot": unique_name, "publication": unique_name},
    )  # fmt: skip
    search_url = stack_env["WALCAST_OPENSEARCH_URL"]
    try:
        init = cli("pg2kafka", env, "--env-file", env_file, "init")
        assert init.returncode == 0, init.stderr[-3000:]
        # Group requests right after the broker came up: the coordinator is still loading.
        for service in ("kafka2search", "kafka2spark"):
            status = cli(service, env, "--env-file", env_file, "status")
            assert status.returncode == 0, f"{service} status: {status.stderr[-3000:]}"
        producer = Producer({"bootstrap.servers": fresh_broker})
        for i in range(1, 4):
            producer.produce(topic, crafted_event("fresh", "insert", 100 + i, i), str(i).encode())
        assert producer.flush(30) == 0
        run = Proc("kafka2search", ["--env-file", env_file, "run"], env, tmp_path / "k2s.log")
        try:
            deadline = time.monotonic() + 240
            while count(search_url, f"{name}-fresh") < 3:
                assert run.alive(), run.tail()
                assert time.monotonic() < deadline, f"not indexed:\n{run.tail()}"
                time.sleep(0.5)
        finally:
            run.stop()
        status = cli("kafka2search", env, "--env-file", env_file, "status", "--json")
        assert status.returncode == 0, status.stderr[-3000:]
        assert json.loads(status.stdout)["total_lag"] == 0
    finally:
        admin.tear_down(pg)
        request(search_url, f"/{name}-fresh-v1", "DELETE")


def request(base: str, path: str, method: str = "GET") -> Any:
    assert base.startswith("http")
    req = urllib.request.Request(base + path, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def count(base: str, alias: str) -> int:
    try:
        answer = request(base, f"/{alias}/_count")
    except urllib.error.HTTPError as exc:
        if exc.code == 503:  # the index just created, its shard not active yet: none yet
            return 0
        raise
    return int(answer["count"]) if answer else 0
