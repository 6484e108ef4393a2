"""walcast demo: a small workload through whatever parts of walcast exist today.

Run by ``deploy/local/walcast demo`` after the local stack is up. It

1. fills a small shop (customers, orders) in the stack's Postgres *before* walcast is
   installed, showing progress;
2. runs each walcast service over it: pg2kafka first brings the existing rows into
   ``walcast.demo.cdc`` (the initial snapshot, with its progress), then streams the
   shop's changes (orders paid, orders deleted) and, through a subscription on orders
   turning paid, notification events into ``walcast.demo.events``, until both slots have
   confirmed everything written; kafka2search then indexes ``walcast.demo.cdc`` into
   OpenSearch until its consumer group has no lag; kafka2spark mirrors it into Delta tables under
   ``.stack/delta`` (one pass, ``available_now``);
3. prints where the results are: Postgres tables and WAL position, Kafka topics and their
   end offsets, search index document counts, Delta table versions;
4. points at the pictures: the benchmarks' PNG plots (throughput and lag over time,
   latency percentiles) under ``bench/results``, or the command that draws them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg.types.json import Jsonb

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack"))
SERVICES = ("pg2kafka", "kafka2search", "kafka2spark")


def read_env() -> dict[str, str]:
    path = STATE / "walcast.env"
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def progress(label: str, done: int, total: int, started: float) -> None:
    rate = done / max(time.monotonic() - started, 1e-6)
    bar = "#" * int(30 * done / total)
    line = f"  {label:<22}[{bar:<30}] {done}/{total} ({rate:,.0f}/s)"
    if sys.stdout.isatty():
        print("\r" + line, end="\n" if done == total else "", flush=True)
    elif done == total or (done * 4 // total) != ((done - 1) * 4 // total):
        print(line, flush=True)  # logs and CI: quarters only


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS demo")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS demo.customers (id bigint PRIMARY KEY, name text NOT NULL,"
            " email text, balance numeric(12,2), created_at timestamptz DEFAULT now())"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS demo.orders (id bigint PRIMARY KEY, customer_id bigint"
            " REFERENCES demo.customers, total numeric(12,2), items jsonb, status text)"
        )


def seed(dsn: str, rows: int) -> None:
    print(f"1. a shop with data before walcast: {rows} customers and {rows * 2} orders")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE demo.orders, demo.customers")
        started = time.monotonic()
        batch = max(rows // 20, 1)
        for lo in range(0, rows, batch):
            hi = min(lo + batch, rows)
            with conn.transaction():
                conn.cursor().executemany(
                    "INSERT INTO demo.customers (id, name, email, balance) VALUES (%s,%s,%s,%s)",
                    [(i, f"customer {i}", f"c{i}@example.com", i * 1.25) for i in range(lo, hi)],
                )
                conn.cursor().executemany(
                    "INSERT INTO demo.orders VALUES (%s,%s,%s,%s,'new')",
                    [
                        (2 * i + k, i, 10 + k, orjson.dumps([{"sku": k}]).decode())
                        for i in range(lo, hi)
                        for k in (0, 1)
                    ],
                )
            progress("inserts", hi, rows, started)
        conn.execute("ANALYZE demo.customers, demo.orders")  # the snapshot's estimate


def changes(dsn: str) -> None:
    """The shop goes on while pg2kafka streams: its changes follow the snapshot."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("UPDATE demo.orders SET status = 'paid' WHERE id % 3 = 0")
        conn.execute("DELETE FROM demo.orders WHERE id % 10 = 9")
    print("  changes:      every 3rd order paid, every 10th order removed")


DEMO_SLOT = "walcast_demo"
DEMO_TOPIC = "walcast.demo.cdc"
DEMO_STREAM = 1
DEMO_EVENTS_SLOT = "walcast_demo_events"


def demo_env() -> dict[str, str]:
    return {
        **os.environ,
        "PG2KAFKA_REPLICATION__SLOT": DEMO_SLOT,
        "PG2KAFKA_REPLICATION__PUBLICATION": DEMO_SLOT,
        "PG2KAFKA_PRODUCER__TOPIC": DEMO_TOPIC,
        "PG2KAFKA_PRODUCER__CREATE_TOPIC": "true",
        "PG2KAFKA_HTTP__PORT": "0",
        "PG2KAFKA_LOG__FORMAT": "text",
        "PG2KAFKA_SUBSCRIPTIONS__ENABLED": "true",
        "PG2KAFKA_SUBSCRIPTIONS__STREAM_ID": str(DEMO_STREAM),
        "PG2KAFKA_SUBSCRIPTIONS__SLOT": DEMO_EVENTS_SLOT,
        "PG2KAFKA_SUBSCRIPTIONS__PUBLICATION": DEMO_EVENTS_SLOT,
        "PG2KAFKA_SUBSCRIPTIONS__TOPIC": "walcast.demo.events",
        "PG2KAFKA_SUBSCRIPTIONS__KEY_FIELD": "group_id",
        "PG2KAFKA_FILTERS__INCLUDE": '["demo.*"]',
        "PG2KAFKA_SNAPSHOT__MODE": "initial",
    }


DEMO_SEARCH_GROUP = "walcast-demo-search"
DEMO_INDEX_PREFIX = "walcast-demo."  # kafka2search's default template, schema demo


def search_env() -> dict[str, str]:
    """kafka2search over the demo topic; the engine (OpenSearch) from the stack's env file."""
    return {
        **os.environ,
        "KAFKA2SEARCH_CONSUMER__TOPICS": f'["{DEMO_TOPIC}"]',
        "KAFKA2SEARCH_CONSUMER__GROUP_ID": DEMO_SEARCH_GROUP,
        "KAFKA2SEARCH_CONSUMER__DLQ_TOPIC": f"{DEMO_TOPIC}.dlq",
        "KAFKA2SEARCH_HTTP__PORT": "0",
        "KAFKA2SEARCH_LOG__FORMAT": "text",
    }


ORDER_PAID = {
    "key": "demo-order-paid",
    "when": "new.status = 'paid' AND old.status IS DISTINCT FROM 'paid'",
    "columns": ["id", "customer_id", "total"],
    "metadata": {"topic": "orders"},
    "extensions": [{"json_path": "group_id", "expression": "new.customer_id::text"}],
}


def pg2kafka_init(env_file: Path, dsn: str, rows: int) -> None:
    """The shop's tables filled first, then walcast installed (``init``: the events slot
    and publication; the CDC slot is created by ``run`` with the initial snapshot), and one
    subscription: orders turning paid become events on walcast.demo.events. Each demo
    starts from a fresh slot and publication (``tear-down`` then ``init``): a slot left by
    an older run may have been invalidated or made for other filters."""
    command = [sys.executable, "-m", "services.pg2kafka", "--env-file", str(env_file)]
    subprocess.run([*command, "tear-down"], env=demo_env(), check=True, stdout=subprocess.DEVNULL)
    create_tables(dsn)
    seed(dsn, rows)
    subprocess.run([*command, "init"], env=demo_env(), check=True, stdout=subprocess.DEVNULL)
    sub = ORDER_PAID
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT _walcast.set_subscriptions(%s, ARRAY[ROW(%s, %s, 'UPDATE', 'demo',"
            " 'orders', %s, %s, %s, %s, now(), now(), NULL)::_walcast.subscriptions])",
            [
                DEMO_STREAM,
                sub["key"],
                DEMO_STREAM,
                sub["when"],
                sub["columns"],
                Jsonb(sub["metadata"]),
                Jsonb(sub["extensions"]),
            ],
        )


def run_until_caught_up(
    service: str,
    env: dict[str, str],
    env_file: Path,
    label: str,
    measure: Callable[[], tuple[int, int]],
    timeout_s: float,
    first: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Path:
    """Run ``service`` (``first(process)`` once it started) until ``measure()`` ->
    (done, total) reports all done, showing progress; then stop it (SIGTERM). Returns
    its log file."""
    log_path = STATE / f"demo-{service}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}", "--env-file", str(env_file), "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        if first is not None:
            first(proc)
        started = time.monotonic()
        while True:
            done, total = measure()
            progress(label, min(done, total), max(total, 1), started)
            if done >= total:
                return log_path
            if proc.poll() is not None:
                raise SystemExit(f"{service} exited with {proc.returncode}; see {log_path}")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"{service} did not catch up in {timeout_s}s; see {log_path}")
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def run_pg2kafka(env: dict[str, str], env_file: Path, timeout_s: float = 300) -> None:
    """Start pg2kafka: its initial snapshot of the existing rows (progress from
    ``_walcast.snapshot_tables``, what ``pg2kafka snapshot status`` shows), then the shop's
    changes, streamed until both slots confirmed everything written; then stop."""
    slots_confirmed = (
        "SELECT min(confirmed_flush_lsn - '0/0'::pg_lsn), count(*) FROM pg_replication_slots"
        " WHERE slot_name IN (%s, %s)"
    )
    dsn = env["WALCAST_PG_DSN"]
    target = start = 0

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM _walcast.snapshots").fetchone()
        earlier = int(row[0]) if row else 0  # runs of earlier demos

    def snapshot_then_changes(proc: subprocess.Popen[bytes]) -> None:
        nonlocal target, start
        started = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT s.state, coalesce(sum(t.rows_done), 0),"
                    " coalesce(sum(greatest(t.rows_estimate, t.rows_done)), 0)"
                    " FROM _walcast.snapshots s LEFT JOIN _walcast.snapshot_tables t"
                    " ON t.snapshot_id = s.id WHERE s.slot = %s AND s.id > %s"
                    " GROUP BY s.id, s.state ORDER BY s.id DESC LIMIT 1",
                    [DEMO_SLOT, earlier],
                ).fetchone()
                if row is not None:
                    state, done, total = str(row[0]), int(row[1]), int(row[2])
                    progress("snapshot (rows)", min(done, total), max(total, 1), started)
                    if state == "done":
                        if done < total:
                            progress("snapshot (rows)", total, total, started)
                        break
                    if state in ("failed", "cancelled"):
                        raise SystemExit(f"pg2kafka's initial snapshot {state}")
                if proc.poll() is not None:
                    raise SystemExit(f"pg2kafka exited with {proc.returncode}")
                if time.monotonic() - started > timeout_s:
                    raise SystemExit(f"no initial snapshot within {timeout_s}s")
                time.sleep(0.5)
            changes(dsn)
            target_row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
            start_row = conn.execute(slots_confirmed, [DEMO_SLOT, DEMO_EVENTS_SLOT]).fetchone()
            assert target_row is not None
            assert start_row is not None
            target, start = int(target_row[0]), int(start_row[0])

    with psycopg.connect(dsn, autocommit=True) as conn:

        def measure() -> tuple[int, int]:
            row = conn.execute(slots_confirmed, [DEMO_SLOT, DEMO_EVENTS_SLOT]).fetchone()
            confirmed = int(row[0]) if row and row[0] is not None and row[1] == 2 else start
            return max(confirmed - start, 0), max(target - start, 0)

        log_path = run_until_caught_up(
            "pg2kafka", demo_env(), env_file, "pg2kafka (WAL bytes)", measure, timeout_s,
            first=snapshot_then_changes,
        )  # fmt: skip
    print(
        "  pg2kafka      initial snapshot, then CDC and subscription slots confirmed;"
        f" log: {log_path}"
    )


def search_status(env_file: Path) -> dict[str, Any]:
    """``kafka2search status --json``, the command an operator would run."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.kafka2search",
            "--env-file",
            str(env_file),
            "status",
            "--json",
        ],
        env=search_env(),
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"kafka2search status failed: {proc.stderr.decode()[-2000:]}")
    status: dict[str, Any] = orjson.loads(proc.stdout)
    return status


def run_kafka2search(env_file: Path, timeout_s: float = 300) -> None:
    """Index the demo topic until the consumer group has committed everything, then stop."""
    last: dict[str, Any] = {}

    def measure() -> tuple[int, int]:
        last.update(search_status(env_file))
        end = sum(p["end"] for p in last["lag"])
        return max(end - last["total_lag"], 0), end

    log_path = run_until_caught_up(
        "kafka2search", search_env(), env_file, "kafka2search (records)", measure, timeout_s
    )
    print(
        f"  kafka2search  {DEMO_TOPIC} indexed into OpenSearch,"
        f" {last['dead_letters']} dead letters; log: {log_path}"
    )


def spark_env() -> dict[str, str]:
    """kafka2spark over the demo topic, once through (``available_now``); tables under
    the stack's delta root (its env file)."""
    return {
        **os.environ,
        "KAFKA2SPARK_SOURCE__TOPICS": f'["{DEMO_TOPIC}"]',
        "KAFKA2SPARK_SOURCE__GROUP_ID": "walcast-demo-spark",
        "KAFKA2SPARK_TRIGGER__MODE": "available_now",
        "KAFKA2SPARK_HTTP__PORT": "0",
        "KAFKA2SPARK_LOG__FORMAT": "text",
    }


def run_kafka2spark(env_file: Path, timeout_s: float = 600) -> None:
    """Mirror the demo topic into Delta: the job reads what the topic holds, then stops."""
    log_path = STATE / "demo-kafka2spark.log"
    started = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.kafka2spark", "--env-file", str(env_file), "run"],
            env=spark_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        while proc.poll() is None:
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"kafka2spark did not finish in {timeout_s}s; see {log_path}")
            batches = len(re.findall(r"\bbatch \d+: ", log_path.read_text(errors="replace")))
            print(f"\r  kafka2spark   running: {batches} batches", end="", flush=True)
            time.sleep(1)
        print()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    if proc.returncode != 0:
        raise SystemExit(f"kafka2spark exited with {proc.returncode}; see {log_path}")
    print(f"  kafka2spark   {DEMO_TOPIC} mirrored into Delta; log: {log_path}")


def run_services(env: dict[str, str], env_file: Path) -> None:
    print("2. walcast services")
    run_pg2kafka(env, env_file)
    run_kafka2search(env_file)
    run_kafka2spark(env_file)
    for name in SERVICES:
        if importlib.util.find_spec(f"services.{name}") is None:
            print(f"  {name:<14}not built yet (see docs/status.md)")


def summary(env: dict[str, str]) -> None:
    print("3. where the results are")
    with psycopg.connect(env["WALCAST_PG_DSN"], autocommit=True) as conn:
        for table in ("demo.customers", "demo.orders"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            print(f"  postgres      {table:<28}{row[0] if row else 0:>10} rows")
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        print(f"  postgres      current WAL position        {lsn[0] if lsn else '?':>10}")
        for slot, confirmed in conn.execute(
            "SELECT slot_name, confirmed_flush_lsn FROM pg_replication_slots"
        ).fetchall():
            print(f"  postgres      slot {slot} confirmed at {confirmed}")

    bootstrap = env["WALCAST_KAFKA_BOOTSTRAP"]
    topics = sorted(
        t
        for t in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
        if t.startswith("walcast.")
    )
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "walcast-demo-summary"})
    try:
        for topic in topics:
            md = consumer.list_topics(topic, timeout=10).topics[topic]
            total = 0
            for p in md.partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high
            print(f"  kafka         {topic:<28}{total:>10} messages (end offsets)")
    finally:
        consumer.close()
    if not topics:
        print("  kafka         no walcast topics yet")

    for engine, key in (
        ("opensearch", "WALCAST_OPENSEARCH_URL"),
        ("elasticsearch", "WALCAST_ELASTICSEARCH_URL"),
    ):
        # Searchable now, not after the next refresh_interval: the counts are exact.
        refresh = urllib.request.Request(  # noqa: S310 - loopback
            env[key] + f"/{DEMO_INDEX_PREFIX}*/_refresh?allow_no_indices=true", method="POST"
        )
        with urllib.request.urlopen(refresh, timeout=30):  # noqa: S310 - loopback
            pass
        url = env[key] + "/_cat/indices?format=json"
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
            indices = [
                i for i in orjson.loads(resp.read()) if i["index"].startswith(DEMO_INDEX_PREFIX)
            ]
        for index in sorted(indices, key=lambda i: i["index"]):
            print(f"  {engine:<14}{index['index']:<28}{index['docs.count']:>10} docs")
        if not indices:
            print(f"  {engine:<14}no {DEMO_INDEX_PREFIX}* indices yet")

    delta_root = STATE / "delta"
    tables = (
        sorted(p.parent for p in delta_root.glob("**/_delta_log")) if delta_root.exists() else []
    )
    from deltalake import DeltaTable

    for path in tables:
        dt = DeltaTable(str(path))
        rows = dt.to_pyarrow_dataset().count_rows()
        name = str(path.relative_to(delta_root))
        print(f"  delta         {name:<28}{rows:>10} rows (version {dt.version()})")
    if not tables:
        print(f"  delta         no tables yet under {delta_root}")


PLOT_COMMAND = "python -m bench.kafka2search_bench --events 20000 --rounds 1 --latency-seconds 20"


def pictures(results: Path = REPO / "bench" / "results") -> list[str]:
    """Where the benchmarks' plots are, or how to draw them (lines to print)."""
    plots = sorted(results.glob("*.png")) if results.is_dir() else []
    if not plots:
        return [
            f"  no plots yet: `{PLOT_COMMAND}` draws live writes, lag and",
            "  commit → searchable percentiles into bench/results/ (docs/benchmarks.md)",
        ]
    return [f"  {p.relative_to(REPO) if p.is_relative_to(REPO) else p}" for p in plots]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="walcast demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000, help="customers to write (orders: 2x)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the demo's replication slots and publications when it ends (they retain"
        " WAL while the stack lives: remove them with the command printed)",
    )
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    env = read_env()
    env_file = STATE / "walcast.env"
    pg2kafka_init(env_file, env["WALCAST_PG_DSN"], args.rows)
    run_services(env, env_file)
    summary(env)
    print("4. pictures (the benchmarks' throughput, lag and latency plots)")
    for line in pictures():
        print(line)
    finish(env_file, keep=args.keep)
    return 0


def finish(env_file: Path, *, keep: bool) -> None:
    """A slot nobody reads retains WAL for as long as the stack lives: the demo removes
    its slots and publications (``tear-down``; topics, indices and tables stay to look
    at), unless asked to keep them — then it says how to remove them."""
    command = [sys.executable, "-m", "services.pg2kafka", "--env-file", str(env_file),
               "tear-down"]  # fmt: skip
    if keep:
        print(f"5. kept: slots {DEMO_SLOT} and {DEMO_EVENTS_SLOT} (they retain WAL until removed);"
              " remove them with:")  # fmt: skip
        env = " ".join(f"{k}={v!r}" for k, v in demo_env().items() if k.startswith("PG2KAFKA_"))
        print(f"  {env} {' '.join(command)}")
        return
    subprocess.run(command, env=demo_env(), check=True, stdout=subprocess.DEVNULL)
    print(f"5. removed: slots and publications {DEMO_SLOT}, {DEMO_EVENTS_SLOT} (nothing left"
          " retaining WAL; `walcast demo --keep` keeps them)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
