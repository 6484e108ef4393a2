"""pg2kafka benchmark: throughput against pg_recvlogical, commit→Kafka latency, memory.

Run against the local stack (``deploy/local/walcast up`` first):

    .venv/bin/python bench/pg2kafka_bench.py [--events 300000] [--rate 5000] [--seconds 20]
        [--workloads small,wide,toast] [--wide-events 100000] [--toast-events 40000]

1. **Throughput**, per workload (:data:`WORKLOADS`: small rows, 50-column ~2 KB rows,
   8 KB out-of-line TOAST values inserted then updated around them). Two pgoutput slots
   are created at the same position; the workload's changes are written in 1000-row
   transactions (a backlog). ``pg_recvlogical``
   drains one slot to /dev/null (the baseline: the server's decoding speed plus a client
   that does nothing), pg2kafka drains the other into Kafka with acks=all. Both are timed
   from process start until the slot's confirmed LSN reaches the end of the backlog.
   Reported: events/s of each and their ratio (targets, small rows: pg2kafka >= 120k
   events/s and >= 0.8 of pg_recvlogical; the other workloads are reported).
2. **Latency.** pg2kafka streams live while a writer commits ``--rate`` events/s (100-row
   transactions) for ``--seconds``; the topic uses LogAppendTime, so latency = broker
   append time - Postgres commit time (same clock). Reported: p50 / p99 (target <= 25 ms).
3. **Memory.** Peak RSS of pg2kafka during each throughput run, against the memory
   guard + 100 MB target.

Prints a table and writes ``bench/results/pg2kafka.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack"))
RESULTS = REPO / "bench" / "results"


def read_env() -> dict[str, str]:
    values = {}
    for line in (STATE / "walcast.env").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            values[k] = v
    return values


def pg_bin(name: str) -> str:
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if found:
        return str(found[-1])
    which = shutil.which(name)
    if which is None:
        raise SystemExit(f"{name} not found")
    return which


class Bench:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.dsn = env["WALCAST_PG_DSN"]
        self.bootstrap = env["WALCAST_KAFKA_BOOTSTRAP"]
        self.run_id = uuid.uuid4().hex[:8]
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap})
        self.cleanup: list[str] = []

    def sql(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            cur = c.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def lsn(self) -> int:
        return int(self.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])

    def confirmed(self, slot: str) -> int:
        rows = self.sql(
            "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [slot],
        )
        return int(rows[0][0]) if rows else 0

    def topic(self, name: str, config: dict[str, str] | None = None) -> None:
        fut = self.admin.create_topics([NewTopic(name, 1, 1, config=config or {})])[name]
        fut.result(30)

    def pg2kafka(self, name: str, log: Path, **extra: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "PG2KAFKA_REPLICATION__SLOT": name,
            "PG2KAFKA_REPLICATION__PUBLICATION": name,
            "PG2KAFKA_SNAPSHOT__MODE": "never",  # streaming only: what it measures
            "PG2KAFKA_PRODUCER__TOPIC": name,
            "PG2KAFKA_HTTP__PORT": "0",
            "PG2KAFKA_LOG__FORMAT": "text",
            **extra,
        }
        with log.open("wb") as out:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.pg2kafka",
                    "--env-file",
                    str(STATE / "walcast.env"),
                    "run",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )

    def wait_confirmed(
        self, slot: str, target: int, proc: subprocess.Popen[bytes], timeout: float = 900
    ) -> float:
        start = time.monotonic()
        while self.confirmed(slot) < target:
            if proc.poll() is not None and proc.returncode not in (0, None):
                raise SystemExit(f"{slot}: process exited with {proc.returncode}")
            if time.monotonic() - start > timeout:
                raise SystemExit(f"{slot}: not caught up within {timeout}s")
            time.sleep(0.05)
        return time.monotonic()

    def init_stream(self, name: str, table: str) -> None:
        self.sql(f'CREATE PUBLICATION "{name}" FOR TABLE {table}')
        self.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [name])
        self.cleanup.append(name)

    def close(self) -> None:
        for name in self.cleanup:
            self.sql(
                "SELECT pg_drop_replication_slot(%s) FROM pg_replication_slots"
                " WHERE slot_name = %s AND NOT active",
                [name, name],
            )
            self.sql(f'DROP PUBLICATION IF EXISTS "{name}"')
        topics = [t for t in self.admin.list_topics(timeout=10).topics if self.run_id in t]
        if topics:
            for fut in self.admin.delete_topics(topics).values():
                fut.result(30)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """CPU spent during one drain by the client, the slot's walsender and the Kafka broker:
    which of the machine's two cores each uses per event. The walsender is found by the
    slot's ``active_pid`` once the client has connected, and sampled until it exits (the
    last sample counts: up to ``interval`` of its CPU may be missed).

    When streaming began (the slot became active: the client started and connected) is
    kept with the client's CPU at that moment (``client_pid``, set once it runs), so a
    drain can be told with and without the client's start-up: a Python service spends
    ~1 s importing and connecting, pg_recvlogical nearly nothing."""

    def __init__(self, b: Bench, slot: str, interval: float = 0.05) -> None:
        self.b, self.slot, self.interval = b, slot, interval
        self.client_pid: int | None = None
        self.active_at: float | None = None
        self.client_cpu_at_active: float | None = None
        pid_file = STATE / "kafka" / "pid"
        self.broker = int(pid_file.read_text()) if pid_file.exists() else None
        self.broker_start = cpu_s(self.broker) if self.broker else None
        self.walsender: int | None = None
        self.walsender_cpu = 0.0
        self._result: dict[str, float | None] | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.is_set():
            if self.walsender is None:
                rows = self.b.sql(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    [self.slot],
                )
                if rows and rows[0][0]:
                    self.walsender = int(rows[0][0])
                    self.active_at = time.monotonic()
                    if self.client_pid is not None:
                        self.client_cpu_at_active = cpu_s(self.client_pid)
            if self.walsender is not None:
                used = cpu_s(self.walsender)
                if used is not None:
                    self.walsender_cpu = used
            time.sleep(self.interval if self.walsender is not None else 0.005)

    def stop(self) -> dict[str, float | None]:
        """CPU seconds of the walsender and the broker since the meter started (the
        first call's: later calls only return it)."""
        if self._result is not None:
            return self._result
        broker = None
        if self.broker and self.broker_start is not None:
            end = cpu_s(self.broker)
            broker = None if end is None else end - self.broker_start
        self._done.set()
        self._thread.join()
        self._result = {"walsender_cpu_s": self.walsender_cpu, "broker_cpu_s": broker}
        return self._result


def drain(b: Bench, name: str, target: int, log: Path, **extra: str) -> tuple[float, float | None]:
    """pg2kafka (a process, its slot and topic ``name``) from start until the slot confirms
    ``target``: (seconds, pg2kafka's CPU seconds), then stopped."""
    started = time.monotonic()
    proc = b.pg2kafka(name, log, PG2KAFKA_REPLICATION__STATUS_INTERVAL_S="0.2",
                      PG2KAFKA_SNAPSHOT__AUTOMATIC="false", **extra)  # fmt: skip
    try:
        ended = b.wait_confirmed(name, target, proc)
        cpu = cpu_s(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return ended - started, cpu


def per_event_us(cpu: float | None, events: int) -> float | None:
    return None if cpu is None else round(cpu / events * 1e6, 2)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _wide_columns() -> tuple[str, str]:
    """(column definitions, select list) of the wide workload: 50 columns, ~2 KB a row."""
    cols = ["id int PRIMARY KEY"]
    exprs = ["g"]
    for i in range(20):
        cols.append(f"i{i} int")
        exprs.append(f"g + {i}")
    for i in range(10):
        cols.append(f"t{i} text")
        exprs.append(f"repeat(md5((g + {i})::text), 5)")  # 160 characters
    for i in range(10):
        cols.append(f"n{i} numeric(12,2)")
        exprs.append(f"(g %% 100000) / 100.0 + {i}")
    for i in range(5):
        cols.append(f"ts{i} timestamptz")
        exprs.append(f"timestamptz '2026-01-01' + g * interval '1 second' + interval '{i} day'")
    for i in range(4):
        cols.append(f"b{i} bool")
        exprs.append(f"(g + {i}) %% 2 = 0")
    return ", ".join(cols), ", ".join(exprs)


WORKLOADS = ("small", "wide", "toast")
"""small: 3 columns (int, int, short text), the issue's reference workload. wide: 50
columns of five types, ~2 KB a row. toast: rows with an 8 KB value stored out of line
(STORAGE EXTERNAL), inserted and then each updated once in another column, so half the
events carry the value and half its unchanged-TOAST marker."""


def write_backlog(b: Bench, workload: str, table: str, events: int) -> None:
    """``events`` changes in 1000-row transactions."""
    with psycopg.connect(b.dsn, autocommit=True) as c:
        if workload == "small":
            for lo in range(1, events + 1, 1000):
                c.execute(
                    f"INSERT INTO {table} SELECT g, g, 'row ' || g"
                    " FROM generate_series(%s::int, %s::int) g",
                    [lo, min(lo + 999, events)],
                )
        elif workload == "wide":
            _, select = _wide_columns()
            for lo in range(1, events + 1, 1000):
                c.execute(
                    f"INSERT INTO {table} SELECT {select} FROM generate_series(%s::int, %s::int) g",
                    [lo, min(lo + 999, events)],
                )
        else:
            rows = events // 2
            for lo in range(1, rows + 1, 1000):
                c.execute(
                    f"INSERT INTO {table} SELECT g, g, repeat(md5(g::text), 256)"
                    " FROM generate_series(%s::int, %s::int) g",
                    [lo, min(lo + 999, rows)],
                )
            for lo in range(1, rows + 1, 1000):
                c.execute(
                    f"UPDATE {table} SET n = n + 1 WHERE id BETWEEN %s AND %s",
                    [lo, min(lo + 999, rows)],
                )


def create_table(b: Bench, workload: str, table: str) -> None:
    if workload == "small":
        b.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, n int, s text)")
    elif workload == "wide":
        b.sql(f"CREATE TABLE {table} ({_wide_columns()[0]})")
    else:
        b.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, n int, doc text)")
        b.sql(f"ALTER TABLE {table} ALTER COLUMN doc SET STORAGE EXTERNAL")


def throughput(b: Bench, events: int, workload: str = "small") -> dict[str, Any]:
    table = f"bench_tp_{workload}_{b.run_id}"
    create_table(b, workload, table)
    base, ours = f"bench_base_{workload}_{b.run_id}", f"bench_ours_{workload}_{b.run_id}"
    b.init_stream(base, table)
    b.init_stream(ours, table)
    b.topic(ours)
    print(
        f"{workload}: writing a backlog of {events:,} changes in 1000-row transactions ...",
        flush=True,
    )
    write_backlog(b, workload, table, events)
    target = b.lsn()

    print(f"{workload}: draining with pg_recvlogical (baseline) ...", flush=True)
    started = time.monotonic()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    base_meter = CpuMeter(b, base)
    recv = subprocess.Popen(
        [
            pg_bin("pg_recvlogical"),
            "-d",
            b.dsn,
            "--slot",
            base,
            "--start",
            "-o",
            "proto_version=1",
            "-o",
            f"publication_names={base}",
            "-f",
            "/dev/null",
            "-E",
            f"{target >> 32:X}/{target & 0xFFFFFFFF:X}",
            "--no-loop",
            "-s",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base_meter.client_pid = recv.pid
    recv.wait(900)
    base_s = time.monotonic() - started
    base_cpu = base_meter.stop()
    base_streaming_s = time.monotonic() - (base_meter.active_at or started)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    recv_cpu = (
        children.ru_utime + children.ru_stime - children_before.ru_utime - children_before.ru_stime
    )
    if recv.returncode != 0:
        raise SystemExit(
            f"pg_recvlogical failed: {recv.stderr.read().decode() if recv.stderr else ''}"
        )

    print(f"{workload}: draining with pg2kafka (acks=all) ...", flush=True)
    log = RESULTS / f"pg2kafka-throughput-{workload}.log"
    started = time.monotonic()
    meter = CpuMeter(b, ours)
    proc = b.pg2kafka(ours, log, PG2KAFKA_REPLICATION__STATUS_INTERVAL_S="0.2")
    meter.client_pid = proc.pid
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        ended = b.wait_confirmed(ours, target, proc)
        ours_cpu = cpu_s(proc.pid)
        cpu = meter.stop()
    finally:
        meter.stop()
        done.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    ours_s = ended - started
    ours_streaming_s = ended - (meter.active_at or started)
    ours_streaming_cpu = (
        ours_cpu - meter.client_cpu_at_active
        if ours_cpu is not None and meter.client_cpu_at_active is not None
        else None
    )
    _, high = Consumer(
        {"bootstrap.servers": b.bootstrap, "group.id": "bench"}
    ).get_watermark_offsets(TopicPartition(ours, 0), timeout=10)
    if high < events:
        raise SystemExit(f"{workload}: {high:,} messages in Kafka for {events:,} changes")
    walsender = per_event_us(cpu["walsender_cpu_s"], events)
    broker = per_event_us(cpu["broker_cpu_s"], events)
    ours_us = per_event_us(ours_cpu, events)
    others = (walsender or 0) + (broker or 0)
    return {
        "workload": workload,
        "events": events,
        "pg_recvlogical_s": round(base_s, 3),
        "pg_recvlogical_events_per_s": round(events / base_s),
        "pg2kafka_s": round(ours_s, 3),
        "pg2kafka_events_per_s": round(events / ours_s),
        "ratio": round(base_s / ours_s, 3),
        # From the moment the slot became active (the client connected): without the
        # client's start-up, which pg_recvlogical hardly has.
        "pg_recvlogical_streaming_events_per_s": round(events / base_streaming_s),
        "pg2kafka_streaming_events_per_s": round(events / ours_streaming_s),
        "streaming_ratio": round(base_streaming_s / ours_streaming_s, 3),
        "pg2kafka_streaming_cpu_us": per_event_us(ours_streaming_cpu, events),
        "kafka_messages": high,
        "pg2kafka_peak_rss_mb": round(peak[0], 1),
        # CPU µs per event. The machine's two cores bound any client: at best
        # 2 s / (walsender + broker + client) per event.
        "pg_recvlogical_cpu_us": per_event_us(recv_cpu, events),
        "pg_recvlogical_walsender_cpu_us": per_event_us(base_cpu["walsender_cpu_s"], events),
        "pg2kafka_cpu_us": ours_us,
        "walsender_cpu_us": walsender,
        "broker_cpu_us": broker,
        "ceiling_if_pg2kafka_were_free_events_per_s": round(2e6 / others) if others else None,
        "cpu_us_for_120k_events_per_s": round(2e6 / 120_000 - others, 2) if others else None,
        "memory_guard_mb": 100,
    }


def latency(b: Bench, rate: int, seconds: int) -> dict[str, Any]:
    table = f"bench_lat_{b.run_id}"
    name = f"bench_lat_{b.run_id}"
    b.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, n int)")
    b.init_stream(name, table)
    b.topic(name, {"message.timestamp.type": "LogAppendTime"})
    proc = b.pg2kafka(name, RESULTS / "pg2kafka-latency.log", PG2KAFKA_PRODUCER__LINGER_MS="2")
    try:
        per_txn = 100
        interval = per_txn / rate
        written = 0
        with psycopg.connect(b.dsn, autocommit=True) as c:
            # Warm-up, not measured: the idempotent producer obtains its producer id
            # (~0.5 s after start) and holds the first messages until it has.
            c.execute(
                f"INSERT INTO {table} SELECT g, g FROM generate_series(%s::int, %s::int) g",
                [written + 1, written + per_txn],
            )
            written += per_txn
            b.wait_confirmed(name, b.lsn(), proc, 60)
            warmup = written
            print(f"live writes at {rate:,} events/s for {seconds}s ...", flush=True)
            start = time.monotonic()
            next_at = start
            while time.monotonic() - start < seconds:
                c.execute(
                    f"INSERT INTO {table} SELECT g, g FROM generate_series(%s::int, %s::int) g",
                    [written + 1, written + per_txn],
                )
                written += per_txn
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            achieved = (written - warmup) / (time.monotonic() - start)
        b.wait_confirmed(name, b.lsn(), proc, 120)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    consumer = Consumer(
        {"bootstrap.servers": b.bootstrap, "group.id": f"{name}-lat", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(name, 0, 0)])
    lat_ms: list[float] = []
    consumed = 0
    deadline = time.monotonic() + 120
    while consumed < written and time.monotonic() < deadline:
        for msg in consumer.consume(5000, 1.0):
            if msg.error():
                continue
            consumed += 1
            if consumed <= warmup:
                continue
            ev = orjson.loads(msg.value())
            commit = datetime.fromisoformat(ev["commit_ts"].replace("Z", "+00:00")).timestamp()
            lat_ms.append(msg.timestamp()[1] - commit * 1000)
    consumer.close()
    lat_ms.sort()
    q = statistics.quantiles(lat_ms, n=100)
    return {
        "target_events_per_s": rate,
        "achieved_events_per_s": round(achieved),
        "events": len(lat_ms),
        "p50_ms": round(q[49], 1),
        "p99_ms": round(q[98], 1),
        "max_ms": round(lat_ms[-1], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000, help="small workload")
    parser.add_argument("--wide-events", type=int, default=100_000)
    parser.add_argument("--toast-events", type=int, default=40_000, help="half inserts")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {WORKLOADS}"
    )
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=int, default=20, help="0: skip the latency part")
    args = parser.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {unknown}: choose from {WORKLOADS}")
    counts = {"small": args.events, "wide": args.wide_events, "toast": args.toast_events}
    RESULTS.mkdir(parents=True, exist_ok=True)
    b = Bench(read_env())
    results: dict[str, Any] = {"workloads": {}}
    try:
        # Latency first: right after a drain, the backlog's aftermath (its checkpoint,
        # autovacuum, the broker flushing segments) put p99 at ~70 ms instead of ~10.
        if args.seconds > 0:
            results["latency"] = latency(b, args.rate, args.seconds)
        for workload in workloads:
            results["workloads"][workload] = throughput(b, counts[workload], workload)
    finally:
        b.close()
    if "small" in results["workloads"]:
        results["throughput"] = results["workloads"]["small"]  # the earlier key
    rows = []
    for workload, tp in results["workloads"].items():
        rows += [
            (
                f"{workload}: pg_recvlogical drain (baseline)",
                f"{tp['pg_recvlogical_events_per_s']:,} ev/s",
                f"{tp['pg_recvlogical_s']} s",
                "",
            ),
            (
                f"{workload}: pg2kafka drain, acks=all",
                f"{tp['pg2kafka_events_per_s']:,} ev/s",
                f"{tp['pg2kafka_s']} s",
                ">= 120,000 ev/s" if workload == "small" else "",
            ),
            (
                f"{workload}: ratio pg2kafka / pg_recvlogical",
                f"{tp['ratio']:.2f}",
                "",
                ">= 0.8" if workload == "small" else "",
            ),
            (
                f"{workload}: streaming (from connect): recvlogical | pg2kafka",
                f"{tp['pg_recvlogical_streaming_events_per_s']:,} | "
                f"{tp['pg2kafka_streaming_events_per_s']:,}",
                f"{tp['streaming_ratio']:.2f}",
                "",
            ),
            (
                f"{workload}: CPU/event pg2kafka streaming (from connect)",
                f"{tp['pg2kafka_streaming_cpu_us']} µs",
                "",
                "<= 8 µs" if workload == "small" else "",
            ),
            (
                f"{workload}: CPU/event pg2kafka | walsender | broker",
                f"{tp['pg2kafka_cpu_us']} | {tp['walsender_cpu_us']} | {tp['broker_cpu_us']} µs",
                "",
                "pg2kafka <= 8 µs" if workload == "small" else "",
            ),
            (
                f"{workload}: CPU/event pg_recvlogical | walsender",
                f"{tp['pg_recvlogical_cpu_us']} | {tp['pg_recvlogical_walsender_cpu_us']} µs",
                "",
                "",
            ),
            (
                f"{workload}: 2 cores' ceiling, pg2kafka free",
                f"{tp['ceiling_if_pg2kafka_were_free_events_per_s']:,} ev/s"
                if tp["ceiling_if_pg2kafka_were_free_events_per_s"]
                else "n/a",
                "",
                f"pg2kafka budget at 120k: {tp['cpu_us_for_120k_events_per_s']} µs",
            ),
            (
                f"{workload}: pg2kafka peak RSS",
                f"{tp['pg2kafka_peak_rss_mb']} MB",
                "",
                f"<= guard {tp['memory_guard_mb']} MB + 100 MB",
            ),
        ]
    lat = results.get("latency")
    if lat:
        rate = lat["achieved_events_per_s"]
        rows += [
            (f"commit->Kafka p50 at {rate:,} ev/s", f"{lat['p50_ms']} ms", "", ""),
            (f"commit->Kafka p99 at {rate:,} ev/s", f"{lat['p99_ms']} ms", "", "<= 25 ms"),
        ]
    print()
    print(f"{'measure':<52}{'value':>24}{'time':>12}  target")
    for name, value, took, target in rows:
        print(f"{name:<52}{value:>24}{took:>12}  {target}")
    out = RESULTS / "pg2kafka.json"
    out.write_text(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
