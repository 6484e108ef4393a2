"""A pg2kafka instance per test: its own slot, publication and topic, run on a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from services.pg2kafka import admin
from services.pg2kafka.app import Service, build
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.errors import PermanentError
from shared.settings import load_settings
from tests.conftest import own_tables


@dataclass
class Harness:
    settings: Pg2KafkaSettings
    dsn: str
    service: Service | None = None
    thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)
    consumer: Consumer | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.service = build(self.settings)

        def run() -> None:
            try:
                assert self.service is not None
                self.service.run()
            except BaseException as exc:  # noqa: BLE001 - surfaced by stop() / events()
                self.error.append(exc)

        self.thread = threading.Thread(target=run, name="pg2kafka", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop pg2kafka, then wait for the server's side of its stream: the walsender
        outlives its client by a moment on a loaded machine, and until it has exited the
        slot is busy and its confirmed position may still be moving."""
        if self.service is not None and self.thread is not None:
            walsender = self._walsender()
            self.service.stop()
            self.thread.join(60)
            assert not self.thread.is_alive(), "pg2kafka did not stop within 60s"
            self.service = None
            deadline = time.monotonic() + 30
            while walsender is not None and self._walsender() == walsender:
                assert time.monotonic() < deadline, (
                    f"the walsender {walsender} of slot {self.settings.replication.slot}"
                    " still streams 30 s after pg2kafka stopped"
                )
                time.sleep(0.1)
        if self.error:
            raise self.error[0]

    def _walsender(self) -> int | None:
        """The pid streaming this harness's slot (None: none, or the server is down)."""
        try:
            rows = self.sql(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                [self.settings.replication.slot],
            )
        except psycopg.Error:
            return None
        return int(rows[0][0]) if rows and rows[0][0] is not None else None

    def sql(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def events(
        self, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 60
    ) -> list[dict[str, Any]]:
        """Consume the topic from the start until ``until(events)`` holds or fail."""
        if self.consumer is None:
            self.consumer = Consumer(
                {
                    "bootstrap.servers": self.settings.kafka.bootstrap_servers,
                    "group.id": f"{self.settings.producer.topic}-reader",
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
            self.consumer.subscribe([self.settings.producer.topic])
        deadline = time.monotonic() + timeout
        while not until(self.seen):
            if self.error:
                raise self.error[0]
            if time.monotonic() > deadline:
                tail = [(e.get("op"), e.get("table")) for e in self.seen[-10:]]
                pytest.fail(
                    f"condition not met within {timeout}s; got {len(self.seen)} events,"
                    f" the last: {tail}"
                )
            # What is there, up to a thousand at a time, before ``until`` looks again:
            # conditions scan everything seen, and a snapshot brings 100k records.
            for msg in self.consumer.consume(1000, 0.5):
                if msg.error():
                    continue
                self.seen.append(orjson.loads(msg.value()))
                self.keys.append(msg.key())
                self.partitions.append(msg.partition())
        return self.seen

    def table_events(self, table: str) -> list[dict[str, Any]]:
        """The data events (not DDL) of ``table`` seen so far."""
        return data(self.seen, table)

    def slot_confirmed(self) -> int:
        rows = self.sql(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [self.settings.replication.slot],
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0  # NULL: none yet


def difference(want: dict[str, Any], got: dict[str, Any]) -> tuple[list[Any], ...]:
    """(missing, extra, wrong) keys, ten of each at most, with the wrong values."""
    missing = sorted(set(want) - set(got))[:10]
    extra = sorted(set(got) - set(want))[:10]
    wrong = [(k, want[k], got[k]) for k in sorted(want) if k in got and got[k] != want[k]][:10]
    return missing, extra, wrong


def data(events: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("table") == table and e["op"] != "ddl"]


def make_settings(env_file: Path, name: str, **sections: dict[str, Any]) -> Pg2KafkaSettings:
    overrides: dict[str, Any] = {
        "replication": {"slot": name, "publication": name, "status_interval_s": 0.5},
        "producer": {
            "topic": f"{name}.cdc",
            "create_topic": True,
            "topic_partitions": 3,
            "linger_ms": 5,
        },
        "http": {"enabled": False},
        "log": {"format": "text"},
        "retry": {"give_up_after_s": 30},
        "filters": {"include": own_tables(name)},  # a test's `filters.include` replaces it
    }
    for key, value in sections.items():
        overrides[key] = {**overrides.get(key, {}), **value}
    return load_settings(Pg2KafkaSettings, env_file=env_file, **overrides)


@pytest.fixture
def env_file(stack_env: dict[str, str]) -> Path:
    return Path(stack_env["WALCAST_STACK_DIR"]) / "walcast.env"


HarnessFactory = Callable[..., Harness]


@pytest.fixture
def make_harness(
    env_file: Path, stack_env: dict[str, str], unique_name: str
) -> Iterator[HarnessFactory]:
    """``make_harness(init=True, **sections)``: a Harness with settings overrides (for
    example ``producer={"partition_key": "primary_key"}``); everything it created — the
    process, the consumer, slot, publication and topic — is removed after the test."""
    made: list[Harness] = []

    def make(*, init: bool = True, **sections: dict[str, Any]) -> Harness:
        settings = make_settings(env_file, unique_name, **sections)
        if init:
            admin.init(settings)
        h = Harness(settings, stack_env["WALCAST_PG_DSN"])
        made.append(h)
        return h

    yield make
    for h in made:
        try:
            h.stop()
        finally:
            if h.consumer is not None:
                h.consumer.close()
            tear_down(h.settings)
            client = AdminClient(h.settings.kafka.client_config())
            if h.settings.producer.topic in client.list_topics(timeout=10).topics:
                delete_topic(h.settings)


def tear_down(settings: Pg2KafkaSettings) -> None:
    """``pg2kafka tear-down`` once the stopped pg2kafka's walsender has gone (on a loaded
    machine it outlives its client by a moment)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.tear_down(settings)
            return
        except PermanentError as exc:
            if "is being streamed" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def keyed_source(make_harness: HarnessFactory, schema: str) -> Harness:
    """pg2kafka (not initialised, not started) streaming the tables of a new ``schema``,
    partitioned by primary key, with an initial snapshot by one reader: the source of the
    tests of ``verify`` and ``repair``."""
    h = make_harness(
        init=False,
        producer={"partition_key": "primary_key"},
        filters={"include": [f"{schema}.*"]},
        snapshot={"mode": "initial", "workers": 1},
    )
    h.sql(f'CREATE SCHEMA "{schema}"')
    return h


def behind_the_slot(h: Harness, statement: str) -> None:
    """Run ``statement`` in Postgres with pg2kafka stopped and its slot then moved past it:
    a change that never reaches Kafka (``verify`` must report it). pg2kafka is started
    again."""
    h.stop()
    h.sql(statement)
    h.sql(
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
        [h.settings.replication.slot],
    )
    h.start()


@pytest.fixture
def harness(make_harness: HarnessFactory) -> Harness:
    return make_harness()


def delete_topic(settings: Pg2KafkaSettings) -> None:
    topic = settings.producer.topic
    client = AdminClient(settings.kafka.client_config())  # must outlive the future
    client.delete_topics([topic])[topic].result(30)


def crafted_event(
    table: str,
    op: str,
    lsn: int,
    row_id: int | None = None,
    *,
    keyless: bool = False,
    snapshot: dict[str, Any] | None = None,
) -> bytes:
    """A change event as pg2kafka writes it, built by hand to place it in a chosen
    partition with a chosen LSN (the row: ``{"id": row_id, "v": lsn}``); ``snapshot``:
    the field of a ``read`` row or an ``op: snapshot`` marker."""
    ev: dict[str, Any] = {
        "v": 1, "op": op, "db": "walcast", "schema": "public", "table": table, "lsn": lsn,
        "seq": 0, "commit_lsn": lsn, "xid": 1, "commit_ts": "2026-01-01T00:00:00.000000Z",
        "key": {}, "new": None, "old": None, "types": {"id": "int4", "v": "int4"},
    }  # fmt: skip
    if row_id is not None:
        ev["key"] = {} if keyless else {"id": row_id}
        ev["new"] = {"id": row_id, "v": lsn}
    if snapshot is not None:
        ev["snapshot"] = snapshot
    return orjson.dumps(ev)


def crafted_toast(value: bytes, big: str | None) -> bytes:
    """A :func:`crafted_event` with a TOAST column ``big``: its value, or (None) left out
    as an unchanged TOAST value, as pgoutput sends an update that did not touch it."""
    ev = orjson.loads(value)
    ev["types"]["big"] = "text"
    if big is None:
        ev["unchanged_toast"] = ["big"]
    else:
        ev["new"]["big"] = big
    return orjson.dumps(ev)
