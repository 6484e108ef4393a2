"""The real Debezium PostgreSQL connector, for tests: started on demand as the local
stack's optional ``debezium`` component (a Kafka Connect standalone worker), one
connector per test with its own slot, publication and topic prefix, removed afterwards.

Nothing here is walcast code: connectors are registered through Kafka Connect's REST API
and their topics read with a plain consumer, so what a test compares comes from
Debezium alone.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

REPO = Path(__file__).resolve().parent.parent


def ensure_running() -> str:
    """Start the optional component if it is not running (a no-op when it is); its URL."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "deploy/local/stack.py"), "up", "debezium"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"deploy/local/stack.py up debezium failed:\n{proc.stdout}{proc.stderr}"
        )
    env = subprocess.run(
        [sys.executable, str(REPO / "deploy/local/stack.py"), "env"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for line in env.splitlines():
        if line.startswith("WALCAST_DEBEZIUM_URL="):
            return line.partition("=")[2]
    raise AssertionError("the env file names no WALCAST_DEBEZIUM_URL")


def rest(url: str, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310
        text = resp.read()
    return json.loads(text) if text else None


def wait_for(check: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


@contextmanager
def connector(base_url: str, stack_env: dict[str, str], name: str, **config: str) -> Iterator[str]:
    """A running Debezium PostgreSQL connector named ``name`` (slot, publication and topic
    prefix named after it); yields the topic prefix. On exit the connector is deleted, its
    slot and publication dropped and its topics deleted."""
    settings = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "database.hostname": stack_env["WALCAST_PG_HOST"],
        "database.port": stack_env["WALCAST_PG_PORT"],
        "database.user": stack_env["WALCAST_PG_USER"],
        "database.password": stack_env["WALCAST_PG_PASSWORD"],
        "database.dbname": stack_env["WALCAST_PG_DATABASE"],
        "topic.prefix": name,
        "slot.name": name,
        "publication.name": f"{name}_pub",
        "publication.autocreate.mode": "filtered",
        # The stack's broker creates no topic on its own: the worker creates them.
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        **config,
    }
    rest(f"{base_url}/connectors/{name}/config", "PUT", settings)
    try:

        def running() -> bool:
            try:
                state = rest(f"{base_url}/connectors/{name}/status")
            except urllib.error.HTTPError:
                return False
            tasks = state.get("tasks", [])
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed:
                raise AssertionError(
                    f"connector {name} failed: {failed[0].get('trace', '')[:2000]}"
                )
            return bool(tasks) and all(t.get("state") == "RUNNING" for t in tasks)

        wait_for(running, f"connector {name} running")
        yield name
    finally:
        _remove(base_url, stack_env, name)


def _remove(base_url: str, stack_env: dict[str, str], name: str) -> None:
    try:
        rest(f"{base_url}/connectors/{name}", "DELETE")
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as conn:

        def slot_released() -> bool:
            row = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", [name]
            ).fetchone()
            return row is None or not row[0]

        wait_for(slot_released, f"slot {name} released by the deleted connector", 120)
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [name],
        )
        conn.execute(f'DROP PUBLICATION IF EXISTS "{name}_pub"')
    admin = AdminClient({"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]})
    topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{name}.")]
    for fut in admin.delete_topics(topics).values() if topics else []:
        fut.result(60)


def read_topic(
    stack_env: dict[str, str], topic: str, until: Callable[[list[Any]], bool], what: str
) -> list[tuple[Any, Any]]:
    """Every record of ``topic`` (one partition) as decoded (key, value) JSON (None for a
    tombstone), read from the start until ``until(records)`` holds."""
    consumer = Consumer(
        {
            "bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"],
            "group.id": f"{topic}-reader",
            "enable.auto.commit": False,
        }
    )
    records: list[tuple[Any, Any]] = []
    try:
        wait_for(lambda: topic in consumer.list_topics(timeout=10).topics, f"topic {topic} created")
        consumer.assign([TopicPartition(topic, 0, 0)])

        def enough() -> bool:
            for msg in consumer.consume(500, timeout=1.0):
                if msg.error():
                    raise AssertionError(f"consuming {topic}: {msg.error()}")
                key, value = msg.key(), msg.value()
                records.append(
                    (
                        json.loads(key) if key is not None else None,
                        json.loads(value) if value is not None else None,
                    )
                )
            return until(records)

        wait_for(enough, what)
    finally:
        consumer.close()
    return records


WALCAST_SOURCE_FIELDS = ("walcast_hash", "walcast_mark", "walcast_snapshot")
"""What pg2kafka's Debezium records add to the connector's ``source`` block (optional
fields, shared/formats/debezium.py): left out before comparing with the connector's."""


def without_walcast_fields(value: Any) -> Any:
    """A Debezium record value (Connect's JSON: ``{"schema", "payload"}``, or a bare
    payload) without walcast's additions to ``source`` — in the payload and, with a
    schema, in the source block's schema."""
    if not isinstance(value, dict):
        return value
    value = copy.deepcopy(value)  # never the caller's: its schema may be shared
    payload = value.get("payload", value)
    if isinstance(payload, dict) and isinstance(payload.get("source"), dict):
        payload["source"] = {
            k: v for k, v in payload["source"].items() if k not in WALCAST_SOURCE_FIELDS
        }
    schema = value.get("schema")
    if isinstance(schema, dict):
        for f in schema.get("fields") or ():
            if f.get("field") == "source":
                f["fields"] = [s for s in f["fields"] if s["field"] not in WALCAST_SOURCE_FIELDS]
    return value
