"""kafka2search benchmark: indexing rate against a raw bulk loader, commit→searchable latency.

Run against the local stack (``deploy/local/walcast up`` first):

    .venv/bin/python bench/kafka2search_bench.py [--engine opensearch|elasticsearch|both]
        [--events 1000000] [--rate 2000] [--latency-seconds 30]

1. **Throughput.** ``--events`` v1 insert events (docs/events.md: distinct rows of one
   table, an int key, text, numeric as exact text, bool, timestamptz; 1000-row
   transactions, primary-key record keys) are written to a fresh 3-partition topic. The
   baseline indexes the same documents — the same bulk bodies kafka2search sends
   (external version = LSN), ``batch.max_docs`` per request, built beforehand — with
   the same engine client into a fresh index with the same mapping and settings, with as
   many requests in flight as kafka2search (``batch.concurrency``): the engine's limit
   for a loader that does nothing else. kafka2search (in-process, on a thread, a new
   consumer group) drains the topic; timed from start until the index counts every
   document (after a refresh). The engine is warmed up first (all the bodies once, not
   measured). Its speed drifts during a run, so the runs alternate in mirrored pairs —
   raw, kafka2search, kafka2search, raw, ... (``--rounds`` of each) — and the best of
   each is compared. Reported: docs/s of each and kafka2search / raw (target >= 0.7);
   and, for the runs compared, the CPU per document of the loader or of kafka2search
   (this process), of the rest of the host (the engine, the broker), and how
   busy the host was — on a small host they all share, this is what bounds the ratio.
2. **Latency.** pg2kafka streams a table while a writer commits ``--rate`` rows/s (20-row
   transactions, the time taken right after each commit) for ``--latency-seconds``;
   kafka2search indexes them with the service defaults (``batch.max_wait_s`` 0.5 s,
   ``index.refresh_interval`` 1 s, which bounds visibility). The index is searched every
   50 ms (no forced refresh) for the rows not yet seen; latency = first poll that
   returned the row - commit. Reported: p50 / p99 (target p99 <= 2 s).

``--engine both`` runs both parts for each engine (the throughput topic is written
once). Prints a table per engine and writes ``bench/results/kafka2search-<engine>.json``.
Everything created (topics, consumer groups, indices, slot, publication, table) is
removed at the end, also after a failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pg2kafka_bench import REPO, RESULTS, STATE, read_env
from bench.plots import latency_percentiles, per_second, timeline
from services.kafka2search.app import Service, build
from services.kafka2search.documents import Doc, Origin, bulk_body
from services.kafka2search.engines import SearchEngine, engine_for
from services.kafka2search.mapping import properties
from services.kafka2search.settings import Kafka2SearchSettings
from services.pg2kafka import admin
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.settings import load_settings

ENGINES = ("opensearch", "elasticsearch")
URL_KEYS = {"opensearch": "WALCAST_OPENSEARCH_URL", "elasticsearch": "WALCAST_ELASTICSEARCH_URL"}
TYPES = {
    "id": "int4",
    "name": "text",
    "price": "numeric",
    "active": "bool",
    "updated_at": "timestamptz",
}
PARTITIONS = 3
TXN_ROWS = 1000  # rows per source transaction in the throughput topic
LAT_TXN_ROWS = 20  # rows per transaction of the latency writer
POLL_S = 0.05  # how often the latency poller searches


class Bench:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.env_file = STATE / "walcast.env"
        self.dsn = env["WALCAST_PG_DSN"]
        self.bootstrap = env["WALCAST_KAFKA_BOOTSTRAP"]
        self.run_id = uuid.uuid4().hex[:8]
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.groups: list[str] = []
        self.engines: dict[str, SearchEngine] = {}
        self.streams: list[Pg2KafkaSettings] = []
        self.tables: list[str] = []

    def sql(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            cur = c.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def topic(self, name: str, partitions: int = PARTITIONS) -> None:
        fut = self.admin.create_topics([NewTopic(name, partitions, 1)])[name]
        fut.result(30)

    @property
    def prefix(self) -> str:
        """Index names of this run start with this (each engine is its own cluster)."""
        return f"bench-k2s-{self.run_id}"

    def engine(self, kind: str) -> SearchEngine:
        if kind not in self.engines:
            self.engines[kind] = engine_for(self.settings(kind, "probe", "probe").engine)
        return self.engines[kind]

    def settings(
        self, kind: str, name: str, topic: str, **sections: dict[str, Any]
    ) -> Kafka2SearchSettings:
        """The service defaults, except what must be unique to the run."""
        overrides: dict[str, Any] = {
            "consumer": {
                "topics": [topic],
                "group_id": f"{name}-group",
                "dlq_topic": f"{name}.dlq",
            },
            "engine": {"kind": kind, "urls": [self.env[URL_KEYS[kind]]]},
            "index": {"name_template": f"{name}-{{schema}}.{{table}}"},
            "http": {"enabled": False},
            "log": {"format": "text"},
            "retry": {"give_up_after_s": 60},
        }
        for key, value in sections.items():
            overrides[key] = {**overrides.get(key, {}), **value}
        return load_settings(Kafka2SearchSettings, env_file=self.env_file, **overrides)

    def close(self) -> None:
        errors: list[str] = []

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - clean up the rest, report at the end
                errors.append(f"{what}: {exc}")

        for settings in self.streams:
            attempt(f"tear down {settings.replication.slot}", admin.tear_down, settings)
        for table in self.tables:
            attempt(f"drop {table}", self.sql, f"DROP TABLE IF EXISTS {table}")
        for kind, engine in self.engines.items():
            attempt(f"delete {kind} indices", delete_indices, engine, self.prefix)
            engine.close()
        if self.groups:
            groups = list(dict.fromkeys(self.groups))
            futures = self.admin.delete_consumer_groups(groups, request_timeout=30)
            for group, fut in futures.items():
                attempt(f"delete group {group}", group_deleted, fut)
        topics = [t for t in self.admin.list_topics(timeout=10).topics if self.run_id in t]
        if topics:
            for topic, fut in self.admin.delete_topics(topics).items():
                attempt(f"delete topic {topic}", fut.result, 30)
        for error in errors:
            print(f"cleanup: {error}", file=sys.stderr)


def group_deleted(fut: Any) -> None:
    try:
        fut.result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:  # never joined
            raise


def delete_indices(engine: SearchEngine, prefix: str) -> None:
    found = engine.request("GET", f"/{prefix}*", params={"expand_wildcards": "all"})
    for index in found or {}:
        engine.delete_index(index)


def host_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the host since boot, from /proc/stat (Linux)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


class CpuMeter:
    """CPU over a timed span: this process's (the loader's, or kafka2search's: it runs on
    threads here, beside a poll loop that costs next to nothing) and the whole host's. The
    difference is what the rest of the host used: the engine and the Kafka broker, and
    whatever else runs (an idle Postgres here). It shows where the CPU goes on a host where
    they all share two cores, which is what bounds the ratio."""

    def __init__(self) -> None:
        self.own = os.times()
        self.host = host_ticks()

    def stop(self, docs: int) -> dict[str, float]:
        own = os.times()
        busy, total = host_ticks()
        tick = os.sysconf("SC_CLK_TCK")
        own_s = (own.user - self.own.user) + (own.system - self.own.system)
        busy_s = (busy - self.host[0]) / tick
        cores = os.cpu_count() or 1
        return {
            "own_cpu_us_per_doc": round(own_s / docs * 1e6, 2),
            "others_cpu_us_per_doc": round(max(busy_s - own_s, 0.0) / docs * 1e6, 2),
            "host_busy": round((busy - self.host[0]) / max(total - self.host[1], 1), 3),
            "cores": cores,
        }


class Running:
    """A kafka2search service on a thread of this process."""

    def __init__(self, settings: Kafka2SearchSettings) -> None:
        self.service: Service = build(settings)
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="kafka2search", daemon=True)

    def _run(self) -> None:
        try:
            self.service.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced by check() / stop()
            self.error.append(exc)

    def start(self) -> Running:
        self.thread.start()
        return self

    def check(self) -> None:
        if self.error:
            raise SystemExit(f"kafka2search failed: {self.error[0]!r}")
        if not self.thread.is_alive():
            raise SystemExit("kafka2search stopped")

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.service.registry.get_sample_value(f"walcast_kafka2search_{name}", labels)
        return value or 0.0

    def indexed(self) -> int:
        return int(self.metric("documents_total", {"action": "index"}))

    def dead_letters(self) -> int:
        return int(
            sum(self.metric("dead_letters_total", {"kind": k}) for k in ("poison", "rejected"))
        )

    def stop(self) -> None:
        self.service.stop()
        self.thread.join(60)
        if self.thread.is_alive():
            raise SystemExit("kafka2search did not stop within 60s")
        if self.error:
            raise SystemExit(f"kafka2search failed: {self.error[0]!r}")


# -- throughput --------------------------------------------------------------------------


def row(i: int, at: datetime) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"customer {i} from the benchmark",
        "price": f"{i % 100_000}.{i % 100:02d}",
        "active": i % 3 != 0,
        "updated_at": (at + timedelta(microseconds=i)).isoformat(),
    }


def source_events(
    table: str, events: int
) -> Iterator[tuple[int, dict[str, Any], bytes, bytes, int]]:
    """(id, row, record key, record value, LSN) for ``events`` inserts, as pg2kafka writes them:
    1000-row transactions, LSNs increasing, primary-key record keys."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    lsn = 0x3000000
    for lo in range(1, events + 1, TXN_ROWS):
        hi = min(lo + TXN_ROWS - 1, events)
        commit_lsn = lsn + (hi - lo + 1) * 120
        commit_ts = (at + timedelta(seconds=lo // TXN_ROWS)).isoformat().replace("+00:00", "Z")
        for seq, i in enumerate(range(lo, hi + 1)):
            new = row(i, at)
            ev = {
                "v": 1,
                "op": "insert",
                "db": "walcast",
                "schema": "public",
                "table": table,
                "lsn": lsn,
                "seq": seq,
                "commit_lsn": commit_lsn,
                "xid": 5000 + lo // TXN_ROWS,
                "commit_ts": commit_ts,
                "key": {"id": i},
                "new": new,
                "old": None,
                "types": TYPES,
            }
            key = orjson.dumps({"t": f"public.{table}", "k": {"id": i}})
            yield i, new, key, orjson.dumps(ev), lsn
            lsn += 120
        lsn = commit_lsn + 64


def produce(b: Bench, topic: str, table: str, events: int, max_docs: int) -> list[bytes]:
    """Write the events; return the raw loader's bulk bodies for the same documents."""
    producer = Producer(
        {
            "bootstrap.servers": b.bootstrap,
            "compression.type": "lz4",
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 200_000,
            "acks": "all",
        }
    )
    failed: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    origin = Origin("raw", 0, 0, None, b"")
    alias = f"{b.prefix}-raw"
    bodies: list[bytes] = []
    docs: list[Doc] = []
    started = time.monotonic()
    for i, new, key, value, lsn in source_events(table, events):
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        docs.append(Doc(alias, str(i), False, lsn, new, (), origin))
        if len(docs) == max_docs:
            bodies.append(bulk_body(docs))
            docs = []
        if i % 100_000 == 0:
            producer.poll(0)
            print(f"  {i:,} events written ({time.monotonic() - started:.0f}s)", flush=True)
    if docs:
        bodies.append(bulk_body(docs))
    if producer.flush(120):
        raise SystemExit("the events were not all delivered to Kafka within 120s")
    if failed:
        raise SystemExit(f"{len(failed)} events not delivered: {failed[0]}")
    return bodies


def raw_load(
    b: Bench, kind: str, bodies: list[bytes], events: int, settings: Kafka2SearchSettings
) -> dict[str, Any]:
    """Index the pre-built bodies into a fresh index like kafka2search's; timed from the
    first bulk request until the documents are counted (after a refresh). Returns the
    seconds taken and the CPU used (:class:`CpuMeter`)."""
    engine = b.engine(kind)
    alias = f"{b.prefix}-raw"  # the bodies' _index
    meta = {"walcast": {"benchmark": "raw bulk loader"}}
    engine.create_index(f"{alias}-v1", alias, settings.index, properties(TYPES), meta)
    print(f"raw bulk loader into {kind} ({len(bodies):,} requests) ...", flush=True)
    errors = 0
    started = time.monotonic()
    cpu = CpuMeter()
    with ThreadPoolExecutor(settings.batch.concurrency) as pool:
        for n, results in enumerate(pool.map(engine.bulk, bodies), 1):
            errors += sum(1 for r in results or () if not 200 <= int(r.get("status", 0)) < 300)
            if n % 100 == 0:
                print(f"  {n * settings.batch.max_docs:,} documents", flush=True)
    engine.refresh(alias)
    count = engine.count(alias)
    raw_s = time.monotonic() - started
    used = cpu.stop(events)
    if errors or count != events:
        raise SystemExit(f"raw loader: {errors} items failed, {count:,} of {events:,} counted")
    engine.delete_index(f"{alias}-v1")  # its merges must not slow kafka2search down
    print(f"  {events / raw_s:,.0f} docs/s", flush=True)
    return {"s": raw_s, "cpu": used}


def warm_up(b: Bench, kind: str, bodies: list[bytes], settings: Kafka2SearchSettings) -> None:
    """Not measured: an engine indexes much slower for its first million documents or so
    after a start (JIT, caches), and whichever loader came first would pay for that."""
    engine = b.engine(kind)
    alias = f"{b.prefix}-raw"
    engine.create_index(f"{alias}-v1", alias, settings.index, properties(TYPES), {})
    print(f"warming {kind} up (not measured) ...", flush=True)
    with ThreadPoolExecutor(settings.batch.concurrency) as pool:
        list(pool.map(engine.bulk, bodies))
    engine.delete_index(f"{alias}-v1")


def k2s_load(b: Bench, kind: str, topic: str, table: str, events: int, run: int) -> dict[str, Any]:
    """kafka2search drains the topic (a new consumer group, a new index); timed from its
    start until the index counts every document (after a refresh)."""
    name = f"{b.prefix}-{kind[:2]}-tp{run}"
    settings = b.settings(kind, name, topic)
    engine = b.engine(kind)
    alias = f"{name}-public.{table}".lower()
    print(f"kafka2search into {kind} ...", flush=True)
    b.groups.append(settings.consumer.group_id)
    started = time.monotonic()
    cpu = CpuMeter()
    k2s = Running(settings).start()
    first_doc = None
    next_count = next_report = started + 10
    progress = (0, started)  # documents indexed, when that number last grew
    try:
        while True:
            k2s.check()
            now = time.monotonic()
            indexed = k2s.indexed()
            if first_doc is None and indexed:
                first_doc = now - started
            if indexed > progress[0]:
                progress = (indexed, now)
            elif now - progress[1] > 120:
                raise SystemExit(f"kafka2search: stuck at {indexed:,} of {events:,} for 120s")
            if k2s.dead_letters():
                raise SystemExit(f"kafka2search dead-lettered {k2s.dead_letters()} records")
            if indexed >= events or now >= next_count:
                next_count = now + 5
                if engine.resolve_alias(alias) is not None:
                    engine.refresh(alias)
                    if engine.count(alias) >= events:
                        break
            if now >= next_report:
                next_report = now + 10
                rate = indexed / (now - started)
                print(f"  {indexed:,} documents ({rate:,.0f} docs/s)", flush=True)
            time.sleep(0.1)
        took = time.monotonic() - started
        used = cpu.stop(events)
        bulks = k2s.metric("bulk_seconds_count")
        bulk_s = k2s.metric("bulk_seconds_sum")
    finally:
        k2s.stop()
    count = engine.count(alias)
    if count != events:
        raise SystemExit(f"kafka2search: {count:,} documents for {events:,} events")
    engine.delete_index(engine.resolve_alias(alias) or alias)  # its merges: not the next run's
    print(f"  {events / took:,.0f} docs/s", flush=True)
    return {
        "s": took,
        "first_doc_s": first_doc or 0.0,
        "bulk_requests": int(bulks),
        "bulk_s": bulk_s,
        "cpu": used,
    }


def throughput(
    b: Bench, kind: str, topic: str, table: str, events: int, bodies: list[bytes], rounds: int
) -> dict[str, Any]:
    """The engine's speed drifts during a run (JIT, merges, the host), by up to a third
    here. So the runs are ordered raw, kafka2search, kafka2search, raw, raw, ... (each
    pair mirrors the one before, which cancels a steady drift), ``rounds`` of each, and
    the best of each is compared."""
    settings = b.settings(kind, f"{b.prefix}-{kind[:2]}-tp", topic)
    warm_up(b, kind, bodies, settings)
    raw_runs: list[dict[str, Any]] = []
    ours_runs: list[dict[str, Any]] = []
    for run in range(rounds):
        if run % 2 == 0:
            raw_runs.append(raw_load(b, kind, bodies, events, settings))
        ours_runs.append(k2s_load(b, kind, topic, table, events, run))
        if run % 2 == 1:
            raw_runs.append(raw_load(b, kind, bodies, events, settings))
    raw = min(raw_runs, key=lambda r: float(r["s"]))
    raw_s = raw["s"]
    best = min(ours_runs, key=lambda r: float(r["s"]))
    return {
        "events": events,
        "partitions": PARTITIONS,
        "bulk_docs": settings.batch.max_docs,
        "bulk_concurrency": settings.batch.concurrency,
        "raw_s": round(raw_s, 3),
        "raw_docs_per_s": round(events / raw_s),
        "raw_runs_docs_per_s": [round(events / r["s"]) for r in raw_runs],
        "kafka2search_s": round(best["s"], 3),
        "kafka2search_docs_per_s": round(events / best["s"]),
        "kafka2search_runs_docs_per_s": [round(events / r["s"]) for r in ours_runs],
        "ratio": round(raw_s / best["s"], 3),
        "kafka2search_first_doc_s": round(best["first_doc_s"], 2),
        "kafka2search_bulk_requests": best["bulk_requests"],
        "kafka2search_bulk_s": round(best["bulk_s"], 1),
        "raw_cpu": raw["cpu"],
        "kafka2search_cpu": best["cpu"],
    }


# -- latency -----------------------------------------------------------------------------


def pg2kafka(b: Bench, settings: Pg2KafkaSettings, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PG2KAFKA_REPLICATION__SLOT": settings.replication.slot,
        "PG2KAFKA_REPLICATION__PUBLICATION": settings.replication.publication,
        "PG2KAFKA_SNAPSHOT__MODE": "never",  # streaming only: what it measures
        "PG2KAFKA_FILTERS__INCLUDE": json.dumps(settings.filters.include),
        "PG2KAFKA_PRODUCER__TOPIC": settings.producer.topic,
        "PG2KAFKA_PRODUCER__PARTITION_KEY": settings.producer.partition_key,
        "PG2KAFKA_HTTP__PORT": "0",
        "PG2KAFKA_LOG__FORMAT": "text",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.pg2kafka", "--env-file", str(b.env_file), "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )


class Visibility:
    """Searches the index (no refresh) for rows not seen yet; records when each appeared."""

    def __init__(self, engine: SearchEngine, alias: str) -> None:
        self.engine = engine
        self.alias = alias
        self.seen: dict[int, float] = {}
        self.low = 1  # every id below is seen

    def poll(self) -> None:
        try:
            answer = self.engine.request(
                "POST",
                f"/{self.alias}/_search",
                body={
                    "size": 10_000,
                    "query": {"range": {"id": {"gte": self.low}}},
                    "sort": [{"id": "asc"}],
                    "_source": False,
                },
                params={"filter_path": "hits.hits._id"},
            )
        except Exception as exc:
            if getattr(exc, "status_code", None) in (404, 503):
                return  # the index does not exist yet, or its shard is not started
            raise
        now = time.time()
        for hit in (answer or {}).get("hits", {}).get("hits", []):
            self.seen.setdefault(int(hit["_id"]), now)
        while self.low in self.seen:
            self.low += 1

    def wait(self, last_id: int, timeout: float, check: Any) -> None:
        deadline = time.monotonic() + timeout
        while self.low <= last_id:
            check()
            if time.monotonic() > deadline:
                raise SystemExit(f"rows up to {last_id} not searchable within {timeout}s")
            self.poll()
            time.sleep(POLL_S)


def latency(b: Bench, kind: str, rate: int, seconds: int) -> dict[str, Any]:
    name = f"bench_k2s_{b.run_id}_{kind[:2]}"
    table = name
    b.sql(
        f"CREATE TABLE {table} (id int PRIMARY KEY, name text, price numeric(12,2),"
        " active bool, updated_at timestamptz)"
    )
    b.tables.append(table)
    p2k = load_settings(
        Pg2KafkaSettings,
        env_file=b.env_file,
        replication={"slot": name, "publication": name},
        filters={"include": [f"public.{table}"]},
        # Streaming only, as the service below runs: init then creates the slot itself.
        snapshot={"mode": "never"},
        producer={
            "topic": f"{name}.cdc",
            "create_topic": True,
            "topic_partitions": PARTITIONS,
            "partition_key": "primary_key",
        },
    )
    admin.init(p2k)
    b.streams.append(p2k)
    lat_name = f"{b.prefix}-{kind[:2]}-lat"  # the consumer group is per engine
    settings = b.settings(kind, lat_name, p2k.producer.topic)
    b.groups.append(settings.consumer.group_id)
    alias = f"{lat_name}-public.{table}".lower()
    proc = pg2kafka(b, p2k, RESULTS / f"kafka2search-{kind}-pg2kafka.log")
    k2s = Running(settings).start()

    def check() -> None:
        k2s.check()
        if proc.poll() is not None:
            raise SystemExit(f"pg2kafka exited with {proc.returncode}")

    seen = Visibility(b.engine(kind), alias)
    insert = (
        f"INSERT INTO {table} SELECT g, 'customer ' || g || ' from the benchmark',"
        " (g %% 100000) + (g %% 100) / 100.0, g %% 3 <> 0, clock_timestamp()"
        " FROM generate_series(%s::int, %s::int) g"
    )
    commits: list[tuple[int, int, float]] = []
    done = threading.Event()
    failed: list[BaseException] = []
    written = [0]
    try:
        with psycopg.connect(b.dsn, autocommit=True) as c:
            # Warm-up, not measured: the index is created with the first documents, the
            # producer and the consumer group settle.
            c.execute(insert, [1, 100])
            written[0] = warmup = 100
            seen.wait(warmup, 120, check)
            print(f"live writes at {rate:,} rows/s for {seconds}s into {kind} ...", flush=True)
            interval = LAT_TXN_ROWS / rate

            def writer() -> None:
                try:
                    next_at = time.monotonic()
                    end = next_at + seconds
                    while time.monotonic() < end:
                        lo, hi = written[0] + 1, written[0] + LAT_TXN_ROWS
                        c.execute(insert, [lo, hi])
                        commits.append((lo, hi, time.time()))
                        written[0] = hi
                        next_at += interval
                        delay = next_at - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    failed.append(exc)
                finally:
                    done.set()

            started = time.monotonic()
            thread = threading.Thread(target=writer, name="writer", daemon=True)
            thread.start()
            next_report = started + 10
            while not done.is_set():
                check()
                seen.poll()
                if time.monotonic() >= next_report:
                    next_report += 10
                    print(
                        f"  {written[0] - warmup:,} rows written, {seen.low - 1 - warmup:,}"
                        " searchable",
                        flush=True,
                    )
                time.sleep(POLL_S)
            thread.join()
            if failed:
                raise failed[0]
            achieved = (written[0] - warmup) / (time.monotonic() - started)
            seen.wait(written[0], 120, check)
    finally:
        k2s.stop()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    lat_ms = sorted((seen.seen[i] - at) * 1000 for lo, hi, at in commits for i in range(lo, hi + 1))
    q = statistics.quantiles(lat_ms, n=100)
    plotted = plot_latency(kind, commits, seen.seen, lat_ms)
    return {
        "plots": [str(p.relative_to(REPO)) for p in plotted],
        "target_rows_per_s": rate,
        "achieved_rows_per_s": round(achieved),
        "rows_per_transaction": LAT_TXN_ROWS,
        "rows": len(lat_ms),
        "p50_ms": round(q[49], 1),
        "p90_ms": round(q[89], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(lat_ms[-1], 1),
        "poll_interval_ms": int(POLL_S * 1000),
        "refresh_interval": settings.index.refresh_interval,
        "batch_max_wait_s": settings.batch.max_wait_s,
    }


def plot_latency(
    kind: str, commits: list[tuple[int, int, float]], seen: dict[int, float], lat_ms: list[float]
) -> list[Path]:
    """Rows written and made searchable per second, the lag between them, and commit →
    searchable by percentile: PNGs next to the JSON."""
    if not commits:
        return []
    start = commits[0][2]
    end = max(max(seen.values()), commits[-1][2])
    written = [at for lo, hi, at in commits for _ in range(lo, hi + 1)]
    searchable = [seen[i] for lo, hi, _ in commits for i in range(lo, hi + 1)]
    w_rate, s_rate = per_second(written, start, end), per_second(searchable, start, end)
    lag, total = [], 0.0
    for (t, w), (_, v) in zip(w_rate, s_rate, strict=True):
        total += w - v
        lag.append((t, total))
    return [
        timeline(RESULTS / f"kafka2search-{kind}-timeline.png",
                 f"kafka2search into {kind}: live writes, commit → searchable",
                 [("rows / s", {"committed in Postgres": w_rate, "searchable": s_rate}),
                  ("rows behind", {"committed, not yet searchable": lag})]),
        latency_percentiles(RESULTS / f"kafka2search-{kind}-latency.png",
                            f"kafka2search into {kind}: commit → searchable",
                            {"commit → searchable": lat_ms}),
    ]  # fmt: skip


# -- report ------------------------------------------------------------------------------


def report(kind: str, tp: dict[str, Any], lat: dict[str, Any] | None) -> None:
    rows = [
        (
            f"raw bulk loader ({tp['bulk_docs']} docs/request, {tp['bulk_concurrency']} at once)",
            f"{tp['raw_docs_per_s']:,} docs/s",
            f"{tp['raw_s']} s",
            "",
        ),
        (
            f"kafka2search ({tp['partitions']} partitions)",
            f"{tp['kafka2search_docs_per_s']:,} docs/s",
            f"{tp['kafka2search_s']} s",
            "",
        ),
        ("ratio kafka2search / raw", f"{tp['ratio']:.2f}", "", ">= 0.7"),
    ]
    for name, cpu in (("raw loader", tp["raw_cpu"]), ("kafka2search", tp["kafka2search_cpu"])):
        rows += [
            (f"  CPU per doc, {name}", f"{cpu['own_cpu_us_per_doc']:,} us", "", ""),
            (
                f"  CPU per doc, rest of host ({name} run)",
                f"{cpu['others_cpu_us_per_doc']:,} us",
                "",
                "",
            ),
            (f"  host busy ({name} run, {cpu['cores']} cores)", f"{cpu['host_busy']:.0%}", "", ""),
        ]
    if lat is not None:
        at = f"{lat['achieved_rows_per_s']:,} rows/s"
        rows += [
            (f"commit->searchable p50 at {at}", f"{lat['p50_ms']:,} ms", "", ""),
            (f"commit->searchable p99 at {at}", f"{lat['p99_ms']:,} ms", "", "<= 2,000 ms"),
        ]
    print(f"\n{kind}: {tp['events']:,} events")
    print(f"{'measure':<50}{'value':>16}{'time':>12}  target")
    for name, value, took, target in rows:
        print(f"{name:<50}{value:>16}{took:>12}  {target}")
    raws = ", ".join(f"{r:,}" for r in tp["raw_runs_docs_per_s"])
    ours = ", ".join(f"{r:,}" for r in tp["kafka2search_runs_docs_per_s"])
    print(f"(runs alternating, best of each compared: raw {raws}; kafka2search {ours} docs/s)")
    print(
        f"(kafka2search's first documents after {tp['kafka2search_first_doc_s']} s: group join"
        " and index creation, included above)"
    )
    if lat is not None:
        print(
            f"(index.refresh_interval {lat['refresh_interval']} and batch.max_wait_s"
            f" {lat['batch_max_wait_s']} s bound the latency; polled every"
            f" {lat['poll_interval_ms']} ms)"
        )
        for plot in lat["plots"]:
            print(f"plot: {plot}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="opensearch")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--latency-seconds", type=int, default=30, help="0: skip the part")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each loader (alternating)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    for client in ("opensearch", "elasticsearch"):  # the poller's 404s before the index exists
        logging.getLogger(client).setLevel(logging.ERROR)
    RESULTS.mkdir(parents=True, exist_ok=True)
    kinds = ENGINES if args.engine == "both" else (args.engine,)
    b = Bench(read_env())
    try:
        topic = f"bench.k2s.{b.run_id}"
        table = f"bench_k2s_{b.run_id}"
        b.topic(topic)
        max_docs = b.settings(kinds[0], "probe", "probe").batch.max_docs
        print(f"writing {args.events:,} change events to {topic} ...", flush=True)
        bodies = produce(b, topic, table, args.events, max_docs)
        for kind in kinds:
            tp = throughput(b, kind, topic, table, args.events, bodies, args.rounds)
            lat = (
                latency(b, kind, args.rate, args.latency_seconds) if args.latency_seconds else None
            )
            report(kind, tp, lat)
            out = RESULTS / f"kafka2search-{kind}.json"
            result = {"engine": kind, "throughput": tp, "latency": lat}
            out.write_text(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
            print(f"written {out}")
    finally:
        b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
