"""One kafka2spark micro-batch, timed: ``--events`` change events (inserts, then updates
of 50,000 keys over three tables, ~200-byte rows) already in a topic, read by Spark's
Kafka source and handed to the mirror (``DeltaMirror``: quarantine check, changelog,
per-table MERGE) as one batch — what every micro-batch of ``source.max_offsets_per_trigger``
records costs.

Baseline in the same run: the least a Kafka → Delta job does with the same records — read
them and append the raw values to one Delta table. ``--ref GIT_REF`` also times another
commit's mirror on the same topic (a temporary worktree), so a change can be compared with
its parent: ``--ref HEAD~1``. Each measurement runs in its own process (its own JVM,
started before the clock), rounds interleaved, the median kept.

Needs the local stack (Kafka; Spark's jars). Prints a table; writes
``bench/results/kafka2spark.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
KEYS = 50_000
TABLES = ("accounts", "tellers", "branches")


def env_file() -> Path:
    return Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack")) / "walcast.env"


def fill(bootstrap: str, topic: str, events: int) -> None:
    import orjson
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"})
    for i in range(events):
        k = i % KEYS
        ev = {
            "v": 1, "op": "insert" if i < KEYS else "update", "db": "bench",
            "schema": "public", "table": TABLES[i % 3], "lsn": 1000 + i, "seq": 0,
            "commit_lsn": 1000 + i, "xid": i, "commit_ts": "2026-01-01T00:00:00.000000Z",
            "key": {"id": k}, "new": {"id": k, "balance": i, "filler": "x" * 84},
            "old": None, "types": {"id": "int4", "balance": "int4", "filler": "bpchar"},
        }  # fmt: skip
        p.produce(topic, orjson.dumps(ev), str(k).encode())
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(120)


def one_round(topic: str, mode: str) -> dict[str, Any]:
    """In a subprocess: the session started, then one batch timed."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from services.kafka2spark.app import kafka_source_options, spark_session
    from services.kafka2spark.mirror import BatchResult, DeltaMirror
    from services.kafka2spark.settings import Kafka2SparkSettings
    from shared.settings import load_settings

    root = Path(tempfile.mkdtemp(prefix=f"walcast-k2s-bench-{mode}-"))
    s = load_settings(
        Kafka2SparkSettings,
        env_file=env_file(),
        source={"topics": [topic], "group_id": f"{topic}-{mode}"},
        delta={"root": str(root)},
        http={"enabled": False},
    )
    spark = spark_session(s)
    spark.range(1).count()  # the JVM and session warm before the clock
    reader = spark.read.format("kafka")
    for key, value in kafka_source_options(s.kafka).items():
        reader = reader.option(key, value)
    df = reader.option("subscribe", topic).load()
    got: list[BatchResult] = []
    started = time.monotonic()
    if mode == "baseline":
        df.select(F.col("value").cast("string").alias("value")).write.format("delta").mode(
            "append"
        ).save(str(root / "raw"))
        phases: dict[str, float] = {}
    else:
        DeltaMirror(spark, s, got.append)(df, 0)
        phases = got[0].phases
    seconds = time.monotonic() - started
    spark.stop()
    return {"seconds": seconds, "phases": phases}


def run_in(tree: Path, topic: str, mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "kafka2spark_bench.py"), "--one-round",
         "--topic", topic, "--mode", mode],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ref", help="also time this git ref's mirror, in the same run")
    ap.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="walcast", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_round:
        print(json.dumps(one_round(args.topic, args.mode)))
        return

    from confluent_kafka.admin import AdminClient

    from services.kafka2spark.settings import Kafka2SparkSettings
    from shared.settings import load_settings

    bootstrap = load_settings(Kafka2SparkSettings, env_file=env_file()).kafka.bootstrap_servers
    topic = f"walcast-k2s-bench-{uuid.uuid4().hex[:8]}"
    fill(bootstrap, topic, args.events)
    runs: dict[str, tuple[Path, str]] = {
        "baseline": (REPO, "baseline"),
        "this tree": (REPO, "walcast"),
    }
    worktree: Path | None = None
    if args.ref:
        worktree = Path(tempfile.mkdtemp(prefix="walcast-k2s-ref-"))
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree),
                        args.ref], check=True, capture_output=True)  # fmt: skip
        runs[args.ref] = (worktree, "walcast")
    got: dict[str, list[dict[str, Any]]] = {label: [] for label in runs}
    try:
        for r in range(args.rounds):
            for label, (tree, mode) in runs.items():
                got[label].append(run_in(tree, topic, mode))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])
        if worktree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(worktree)], check=False)  # fmt: skip

    n = args.events
    base = statistics.median(x["seconds"] for x in got["baseline"])
    rows = []
    print(f"\none micro-batch of {n:,} events, median of {args.rounds} rounds")
    print(f"{'code':<14} {'seconds':>8} {'events/s':>10} {'vs baseline':>12}  slowest phases")
    for label, results in got.items():
        sec = statistics.median(x["seconds"] for x in results)
        phases: dict[str, float] = {}
        for x in results:
            for k, v in x["phases"].items():
                phases[k] = phases.get(k, 0.0) + v / len(results)
        top = ", ".join(
            f"{k} {v:.1f}s" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])[:4]
        )
        rows.append({"code": label, "seconds": sec, "events_per_s": n / sec,
                     "vs_baseline": base / sec, "phases": phases})  # fmt: skip
        print(f"{label:<14} {sec:>8.1f} {n / sec:>10,.0f} {base / sec:>12.2f}  {top}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "kafka2spark.json"
    out.write_text(json.dumps({"events": n, "rounds": args.rounds, "rows": rows}, indent=2))
    print(f"\nwritten: {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
