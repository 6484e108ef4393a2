"""A kafka2search instance per test, on a thread, fed by a pg2kafka harness; its group,
dead-letter topic and indices are unique to the test and removed afterwards."""

from __future__ import annotations

import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from services.kafka2search.app import Service, build
from services.kafka2search.engines import SearchEngine, engine_for
from services.kafka2search.settings import Kafka2SearchSettings
from shared.settings import load_settings


def search_settings(
    env_file: Path, stack_env: dict[str, str], kind: str, name: str, topic: str, **sections: Any
) -> Kafka2SearchSettings:
    url = stack_env[
        "WALCAST_OPENSEARCH_URL" if kind == "opensearch" else "WALCAST_ELASTICSEARCH_URL"
    ]
    overrides: dict[str, Any] = {
        "consumer": {"topics": [topic], "group_id": f"{name}-group", "dlq_topic": f"{name}.dlq"},
        "engine": {"kind": kind, "urls": [url]},
        "index": {"name_template": f"{name}-{{schema}}.{{table}}", "refresh_interval": "200ms"},
        "batch": {"max_wait_s": 0.2},
        "http": {"enabled": False},
        "log": {"format": "text"},
        "retry": {"give_up_after_s": 60},
    }
    for key, value in sections.items():
        overrides[key] = {**overrides.get(key, {}), **value}
    return load_settings(Kafka2SearchSettings, env_file=env_file, **overrides)


@dataclass
class Indexer:
    settings: Kafka2SearchSettings
    name: str
    service: Service | None = None
    thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)
    engine: SearchEngine | None = None

    def start(self) -> Indexer:
        self.service = build(self.settings)

        def run() -> None:
            try:
                assert self.service is not None
                self.service.run()
            except BaseException as exc:  # noqa: BLE001 - surfaced by stop() / wait()
                self.error.append(exc)

        self.thread = threading.Thread(target=run, name="kafka2search", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.service is not None and self.thread is not None:
            self.service.stop()
            self.thread.join(60)
            assert not self.thread.is_alive(), "kafka2search did not stop within 60s"
            self.service = None
        if self.error:
            raise self.error[0]

    @property
    def es(self) -> SearchEngine:
        if self.engine is None:
            self.engine = engine_for(self.settings.engine)
        return self.engine

    def alias(self, table: str, schema: str = "public") -> str:
        return f"{self.name}-{schema}.{table}".lower()

    def docs(self, table: str) -> dict[str, dict[str, Any]]:
        """Every document of the table's index (refreshed), by id; {} if no index."""
        alias = self.alias(table)
        if self.es.resolve_alias(alias) is None:
            return {}
        self.es.refresh(alias)
        answer = self.es.request(
            "POST",
            f"/{alias}/_search",
            body={
                "size": 10000,
                "query": {"match_all": {}},
                "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]},
            },
        )
        return {h["_id"]: h["_source"] for h in answer["hits"]["hits"]}

    def docs_all(self, table: str, schema: str = "public") -> dict[str, dict[str, Any]]:
        """Every document of the table's index, however many (a scroll), by id."""
        alias = self.alias(table, schema)
        if self.es.resolve_alias(alias) is None:
            return {}
        self.es.refresh(alias)
        out: dict[str, dict[str, Any]] = {}
        page = self.es.request(
            "POST", f"/{alias}/_search",
            body={"size": 5000, "sort": ["_doc"],
                  "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]}},
            params={"scroll": "2m"},
        )  # fmt: skip
        while page["hits"]["hits"]:
            out.update({h["_id"]: h["_source"] for h in page["hits"]["hits"]})
            page = self.es.request(
                "POST", "/_search/scroll", body={"scroll": "2m", "scroll_id": page["_scroll_id"]}
            )
        self.es.request("DELETE", "/_search/scroll", body={"scroll_id": [page["_scroll_id"]]})
        return out

    def broken_stamps(self, table: str, schema: str = "public") -> list[str]:
        """Ids of the table's documents whose stamp does not hold: no ``_walcast_body``, or
        one that is not the CRC-32 of the source bytes after it (checked here, apart from
        services/kafka2search/stamps.py, on each ``_source`` as the engine returns it)."""
        alias = self.alias(table, schema)
        self.es.refresh(alias)
        body = {"size": 10000, "_source": False, "query": {"match_all": {}}}
        hits = self.es.request("POST", f"/{alias}/_search", body=body)["hits"]["hits"]
        broken = []
        for h in hits:
            raw = self.es.request_raw("GET", f"/{alias}/_source/{quote(h['_id'], safe='')}")
            found = re.search(rb'"_walcast_body":(\d+)', raw)
            if found is None or zlib.crc32(raw[found.end() :]) != int(found.group(1)):
                broken.append(h["_id"])
        return broken

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error:
                raise self.error[0]
            if predicate():
                return
            time.sleep(0.2)
        pytest.fail(f"timed out after {timeout}s waiting for {what}")

    def dead_letters(self, want: int, timeout: float = 30) -> list[dict[str, Any]]:
        topic = self.settings.consumer.dlq_topic
        c = Consumer({"bootstrap.servers": self.settings.kafka.bootstrap_servers,
                      "group.id": f"{topic}-verify", "enable.auto.commit": False})  # fmt: skip
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


IndexerFactory = Callable[..., Indexer]


@pytest.fixture(params=["opensearch", "elasticsearch"])
def engine_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_indexer(
    env_file: Path, stack_env: dict[str, str], unique_name: str, engine_kind: str
) -> Iterator[IndexerFactory]:
    made: list[Indexer] = []

    def make(topic: str, **sections: Any) -> Indexer:
        name = unique_name.replace("_", "-")
        ix = Indexer(
            search_settings(env_file, stack_env, engine_kind, name, topic, **sections), name
        )
        made.append(ix)
        return ix

    yield make
    for ix in made:
        try:
            ix.stop()
        finally:
            try:
                for alias, index in ix.es.aliases(f"{ix.name}-*").items():
                    ix.es.delete_index(index)
                    del alias
            finally:
                ix.es.close()
            client = AdminClient(ix.settings.kafka.client_config())
            dlq = ix.settings.consumer.dlq_topic
            if dlq in client.list_topics(timeout=10).topics:
                client.delete_topics([dlq])[dlq].result(30)


def jsonish(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value))
