"""A kafka2postgres instance per test, on a thread, fed by a pg2kafka harness, writing
into a target database of its own (created on the stack's server, dropped afterwards).

The comparisons read both databases with plain SQL (:func:`table_rows`,
:func:`table_schema`): nothing of kafka2postgres's code decides what "equal" means."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from services.kafka2postgres.app import Service, build
from services.kafka2postgres.settings import Kafka2PostgresSettings
from shared.settings import load_settings


@dataclass
class Replica:
    settings: Kafka2PostgresSettings
    dsn: str  # the target database
    service: Service | None = None
    thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)

    def start(self) -> Replica:
        self.service = build(self.settings)

        def run() -> None:
            try:
                assert self.service is not None
                self.service.run()
            except BaseException as exc:  # noqa: BLE001 - surfaced by stop() / wait()
                self.error.append(exc)

        self.thread = threading.Thread(target=run, name="kafka2postgres", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.service is not None and self.thread is not None:
            self.service.stop()
            self.thread.join(60)
            assert not self.thread.is_alive(), "kafka2postgres did not stop within 60s"
            self.service = None
        if self.error:
            raise self.error[0]

    def sql(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            cur = c.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 120) -> None:
        """Until ``predicate`` holds; fails with ``what`` (and the service's error, if it
        stopped). The deadline is generous: progress, not speed, is what is waited for."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error:
                raise self.error[0]
            if predicate():
                return
            time.sleep(0.2)
        pytest.fail(f"timed out after {timeout}s waiting for {what}; {self.diagnosis()}")

    def diagnosis(self) -> str:
        """What the target's bookkeeping and the dead-letter topic say."""
        try:
            book = self.sql(
                'SELECT source_table, floor, schema_at, stopped FROM "_walcast_target"."tables"'
            )
        except psycopg.Error as exc:
            book = [(f"no bookkeeping: {exc}",)]
        dead = [d["headers"] for d in self.dead_letters(3, timeout=3)]
        return f"tables {book}; dead letters {dead}"

    def wait_equal(self, source_dsn: str, qualified: str, key: str, timeout: float = 120) -> None:
        """Until the target's table equals the source's, row by row (:func:`table_rows`);
        fails with the difference, the table's bookkeeping and the dead letters."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error:
                raise self.error[0]
            want, got = table_rows(source_dsn, qualified, key), table_rows(self.dsn, qualified, key)
            if want == got:
                return
            time.sleep(0.3)
        from tests.integration.conftest import difference

        pytest.fail(
            f"{qualified} not equal after {timeout}s ({len(got)} of {len(want)} rows):"
            f" {difference(want, got)}; {self.diagnosis()}"
        )

    def dead_letters(self, want: int, timeout: float = 30) -> list[dict[str, Any]]:
        topic = self.settings.consumer.dlq_topic
        c = Consumer({"bootstrap.servers": self.settings.kafka.bootstrap_servers,
                      "group.id": f"{topic}-read", "enable.auto.commit": False})  # fmt: skip
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        try:
            while len(out) < want and time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is None or msg.error():
                    continue
                out.append({"value": msg.value(), "headers": dict(msg.headers() or [])})
        finally:
            c.close()
        return out


def table_rows(dsn: str, qualified: str, key: str = "1") -> dict[str, str]:
    """Every row of a table as Postgres prints it (``to_jsonb``), by its key's text."""
    with psycopg.connect(dsn, autocommit=True) as c:
        exists = c.execute("SELECT to_regclass(%s)", [qualified]).fetchone()
        if not exists or exists[0] is None:
            return {}
        rows = c.execute(f"SELECT ({key})::text, to_jsonb(t)::text FROM {qualified} t").fetchall()
    return {str(k): str(v) for k, v in rows}


def table_schema(dsn: str, qualified: str) -> tuple[list[tuple[str, str]], list[str]]:
    """A table's columns (name, type as ``format_type`` prints it, in column order) and
    its primary key's columns, from the catalog."""
    with psycopg.connect(dsn, autocommit=True) as c:
        cols = c.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            [qualified],
        ).fetchall()
        key = c.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
            " AND a.attnum = ANY (i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary"
            " ORDER BY array_position(i.indkey, a.attnum)",
            [qualified],
        ).fetchall()
    return [(str(n), str(t)) for n, t in cols], [str(k[0]) for k in key]


ReplicaFactory = Callable[..., Replica]


@pytest.fixture
def target_dsn(stack_env: dict[str, str]) -> Iterator[str]:
    """A database of its own on the stack's server, dropped afterwards."""
    name = f"k2p_{uuid.uuid4().hex[:12]}"
    admin = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    yield admin.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def make_replica(
    env_file: Path, stack_env: dict[str, str], unique_name: str, target_dsn: str
) -> Iterator[ReplicaFactory]:
    """``make_replica(topic, **sections)``: a kafka2postgres on ``topic`` writing into
    :func:`target_dsn`; its group and dead-letter topic are removed afterwards."""
    made: list[Replica] = []
    database = target_dsn.rsplit("/", 1)[1]

    def make(topic: str, **sections: Any) -> Replica:
        name = unique_name.replace("_", "-")
        overrides: dict[str, Any] = {
            "consumer": {"topics": [topic], "group_id": f"{name}-k2p", "dlq_topic": f"{name}.dlq"},
            "target": {"postgres": {
                "host": stack_env["WALCAST_PG_HOST"], "port": int(stack_env["WALCAST_PG_PORT"]),
                "user": stack_env["WALCAST_PG_USER"], "password": stack_env["WALCAST_PG_PASSWORD"],
                "database": database}},
            "batch": {"max_wait_s": 0.2},
            "http": {"enabled": False},
            "log": {"format": "text"},
            "retry": {"give_up_after_s": 60},
        }  # fmt: skip
        for key, value in sections.items():
            merged = {**overrides.get(key, {}), **value}
            if key == "target" and "postgres" in value:  # one level deeper: the connection
                merged["postgres"] = {**overrides["target"]["postgres"], **value["postgres"]}
            overrides[key] = merged
        r = Replica(
            load_settings(Kafka2PostgresSettings, env_file=env_file, **overrides), target_dsn
        )
        made.append(r)
        return r

    yield make
    for r in made:
        try:
            r.stop()
        finally:
            client = AdminClient(r.settings.kafka.client_config())
            client.delete_consumer_groups([r.settings.consumer.group_id])
            client.delete_topics([r.settings.consumer.dlq_topic])
