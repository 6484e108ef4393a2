"""kafka2spark throughput and latency, each against a raw Spark job in the same run.

    .venv/bin/python bench/kafka2spark_bench.py [--events 1000000] [--rounds 1]
        [--max-offsets 200000 50000 1000000] [--latency-seconds 120] [--rate 5000]
    .venv/bin/python bench/kafka2spark_bench.py --one-batch [--events 200000] [--ref REF]

**Stream** (the default): ``--events`` change events (inserts, then updates with a
tenth deletes and a tenth re-inserts, over three tables of 50,000 keys, ~200-byte rows)
already in a topic; the real job (``build(settings)``: Spark's Kafka source, the default
processing-time trigger, ``DeltaMirror`` with the group commit) runs until it has mirrored
them all, once per ``--max-offsets`` value (``source.max_offsets_per_trigger``). Baseline
in the same run: a raw streaming job with the same source, trigger and batch bound —
parse each record against the envelope and append the rows to one Delta table, no MERGE.
Each job runs in its own process, the JVM and session started before the clock. Where
the time goes comes from the mirror's own phase timings, summed over the batches.

**Latency**: a producer writes change events at a steady ``--rate`` for
``--latency-seconds`` while the job runs with its defaults; an event is visible when the
batch holding its offset has finished (its MERGEs committed). Commit time is the
record's Kafka timestamp (set when produced); p50 / p99 / max reported.

**One batch** (``--one-batch``): one micro-batch of ``--events`` handed straight to the
mirror, against one raw append; ``--ref GIT_REF`` also times another commit's mirror on
the same topic (a temporary worktree), for comparing a change with its parent.

Needs the local stack (Kafka; Spark's jars). Prints tables; writes
``bench/results/kafka2spark.json`` (one batch: ``kafka2spark-batch.json``).
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
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4"})
    for i in range(events):
        k, value = change(i)
        p.produce(topic, value, k)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(120)


def change(
    i: int, lsn_base: int = 1000, commit_ts: str = "2026-01-01T00:00:00.000000Z"
) -> tuple[bytes, bytes]:
    """Change event ``i`` (key, value): inserts of every key first, then updates, with
    every tenth a delete and every tenth a re-insert."""
    import orjson

    k = i % KEYS
    op = "insert" if i < KEYS else ("delete", "insert", *["update"] * 8)[i % 10]
    row = None if op == "delete" else {"id": k, "balance": i, "filler": "x" * 84}
    ev = {
        "v": 1, "op": op, "db": "bench", "schema": "public", "table": TABLES[i % 3],
        "lsn": lsn_base + i, "seq": 0, "commit_lsn": lsn_base + i, "xid": i,
        "commit_ts": commit_ts, "key": {"id": k}, "new": row,
        "old": {"id": k} if op == "delete" else None,
        "types": {"id": "int4", "balance": "int4", "filler": "bpchar"},
    }  # fmt: skip
    return str(k).encode(), orjson.dumps(ev)


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


def settings_for(topic: str, mode: str, root: Path, **source: Any) -> Any:
    from services.kafka2spark.settings import Kafka2SparkSettings
    from shared.settings import load_settings

    return load_settings(
        Kafka2SparkSettings,
        env_file=env_file(),
        source={"topics": [topic], "group_id": f"{topic}-{mode}", **source},
        delta={"root": str(root)},
        http={"enabled": False},
    )


def stream_round(topic: str, mode: str, events: int, max_offsets: int) -> dict[str, Any]:
    """In a subprocess: the streaming job (walcast's, or the raw one) until it has read
    ``events`` records; the seconds from the query's start, and the mirror's phases."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    from services.kafka2spark.app import build, kafka_source_options, spark_session
    from services.kafka2spark.mirror import BatchResult
    from services.kafka2spark.schema import ENVELOPE

    root = Path(tempfile.mkdtemp(prefix=f"walcast-k2s-bench-{mode}-"))
    s = settings_for(topic, f"{mode}-{max_offsets}", root, max_offsets_per_trigger=max_offsets)
    spark = spark_session(s)
    spark.range(1).count()  # the JVM and session warm before the clock
    results: list[BatchResult] = []
    if mode == "raw":
        reader = spark.readStream.format("kafka")
        for key, value in kafka_source_options(s.kafka).items():
            reader = reader.option(key, value)

        def append(df: DataFrame, batch_id: int) -> None:
            rows = df.select(F.from_json(F.col("value").cast("string"), ENVELOPE).alias("e"))
            rows.select("e.*").write.format("delta").mode("append").save(str(root / "raw"))

        started = time.monotonic()
        query = (
            reader.option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", max_offsets)
            .option("minPartitions", s.source.min_partitions())  # as the job reads
            .load()
            .writeStream.foreachBatch(append)
            .option("checkpointLocation", str(root / "raw-checkpoint"))
            .trigger(processingTime=f"{s.trigger.interval_s} seconds")
            .start()
        )
    else:
        service = build(s, spark)
        done = service.mirror.on_batch

        def note(r: BatchResult) -> None:
            done(r)
            results.append(r)

        service.mirror.on_batch = note
        started = time.monotonic()
        query = service.start()
    read = 0
    while read < events:
        if not query.isActive:
            raise SystemExit(f"the query stopped: {query.exception()}")
        query.awaitTermination(1)
        read = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
    seconds = time.monotonic() - started
    query.stop()
    phases: dict[str, float] = {}
    for r in results:
        for name, sec in r.phases.items():
            label = "tables (MERGE)" if name.startswith("table ") else name
            phases[label] = phases.get(label, 0.0) + sec
    quarantined = sum(r.quarantined for r in results)
    spark.stop()
    return {"seconds": seconds, "batches": len(query.recentProgress), "phases": phases,
            "quarantined": quarantined, "read": read}  # fmt: skip


def latency_round(topic: str, until: float) -> dict[str, Any]:
    """In a subprocess: the job with its defaults until wall time ``until``; each finished
    batch's end (wall time) and its last offset per partition, for the parent to match
    with the records' produce times."""
    from services.kafka2spark.app import build, spark_session

    root = Path(tempfile.mkdtemp(prefix="walcast-k2s-bench-latency-"))
    s = settings_for(topic, "latency", root)
    spark = spark_session(s)
    spark.range(1).count()
    service = build(s, spark)
    ends: list[dict[str, Any]] = []
    done = service.mirror.on_batch

    def note(r: Any) -> None:
        done(r)
        ends.append({"at": time.time(), "offsets": {str(p): o for (_t, p), o in r.offsets.items()},
                     "seconds": r.seconds})  # fmt: skip

    service.mirror.on_batch = note
    query = service.start()
    print(json.dumps({"ready": time.time()}), flush=True)
    while time.time() < until:
        if not query.isActive:
            raise SystemExit(f"the query stopped: {query.exception()}")
        query.awaitTermination(1)
    query.stop()
    spark.stop()
    return {"batches": ends}


def sub(*args: str, tree: Path = REPO) -> list[str]:
    return [sys.executable, str(tree / "bench" / "kafka2spark_bench.py"), "--inner", *args]


def run_json(cmd: list[str], tree: Path = REPO) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "WALCAST_STACK_DIR": str(env_file().parent)}
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        # Said in the results, not raised: a job failing at some setting is a finding
        # (a batch too large for the driver, say), and the other runs still count.
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("%")]
        error = " | ".join(tail[-3:])[-500:]
        RESULTS.mkdir(parents=True, exist_ok=True)
        log = RESULTS / f"kafka2spark-failed-{uuid.uuid4().hex[:8]}.log"
        log.write_text(proc.stderr)  # the JVM's own account of it, whole
        print(f"{' '.join(cmd[2:])} failed: {error} (stderr: {log})", file=sys.stderr)
        return {"failed": error, "stderr": str(log)}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def new_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"walcast-k2s-bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    return topic


def one_batch_main(args: argparse.Namespace, bootstrap: str) -> None:
    topic = new_topic(bootstrap)
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
                cmd = [sys.executable, str(tree / "bench" / "kafka2spark_bench.py"),
                       "--one-round", "--topic", topic, "--mode", mode]  # fmt: skip
                got[label].append(run_json(cmd, tree))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        delete_topic(bootstrap, topic)
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
        rows.append({"code": label, "seconds": sec, "events_per_s": n / sec,
                     "vs_baseline": base / sec, "phases": phases})  # fmt: skip
        print(f"{label:<14} {sec:>8.1f} {n / sec:>10,.0f} {base / sec:>12.2f}  {top(phases, 4)}")
    write("kafka2spark-batch.json", {"events": n, "rounds": args.rounds, "rows": rows})


def top(phases: dict[str, float], n: int) -> str:
    ordered = sorted(phases.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{k} {v:.1f}s" for k, v in ordered)


def delete_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic])


def write(name: str, data: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / name
    out.write_text(json.dumps(data, indent=2))
    print(f"\nwritten: {out.relative_to(REPO)}")


def stream_main(args: argparse.Namespace, bootstrap: str) -> None:
    n = args.events
    if args.latency_only:
        only = latency_main(args, bootstrap)
        print(json.dumps(only, indent=2))
        write("kafka2spark-latency.json", only)
        return
    topic = new_topic(bootstrap)
    print(f"filling {topic} with {n:,} change events ...", file=sys.stderr)
    fill(bootstrap, topic, n)
    rows: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for m in args.max_offsets:
                for mode in ("raw", "walcast"):
                    got = run_json(sub("stream", topic, mode, str(n), str(m)))
                    got.update(mode=mode, max_offsets=m, round=r + 1)
                    rows.append(got)
                    took = "failed" if "failed" in got else f"{got['seconds']:.1f}s"
                    print(f"round {r + 1}: {mode}, max_offsets_per_trigger {m:,}: {took}",
                          file=sys.stderr)  # fmt: skip
    finally:
        delete_topic(bootstrap, topic)
    latency = latency_main(args, bootstrap) if args.latency_seconds > 0 else None

    print(f"\n{n:,} change events (3 tables; inserts, updates, deletes), default trigger"
          f" ({'processing time'}); median of {args.rounds} round(s)")  # fmt: skip
    print(f"{'max_offsets_per_trigger':>24} {'raw job ev/s':>13} {'kafka2spark ev/s':>17}"
          f" {'ratio':>6} {'batches':>8}  where kafka2spark's time goes")  # fmt: skip
    summary = []
    for m in args.max_offsets:
        raws = [x for x in rows if x["mode"] == "raw" and x["max_offsets"] == m]
        ours = [x for x in rows if x["mode"] == "walcast" and x["max_offsets"] == m]
        failed = [x["failed"] for x in raws + ours if "failed" in x]
        raws = [x for x in raws if "failed" not in x]
        ours = [x for x in ours if "failed" not in x]
        raw = statistics.median(x["seconds"] for x in raws) if raws else None
        sec = statistics.median(x["seconds"] for x in ours) if ours else None
        phases: dict[str, float] = {}
        for x in ours:
            for k, v in x["phases"].items():
                phases[k] = phases.get(k, 0.0) + v / len(ours)
        total = sum(phases.values()) or 1.0
        where = ", ".join(
            f"{k} {v / total:.0%}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])
        )
        batches = ours[0]["batches"] if ours else 0
        summary.append({"max_offsets_per_trigger": m,
                        "raw_events_per_s": n / raw if raw else None,
                        "kafka2spark_events_per_s": n / sec if sec else None,
                        "ratio": raw / sec if raw and sec else None,
                        "batches": batches, "phases_s": phases, "failed": failed})  # fmt: skip
        raw_s = f"{n / raw:,.0f}" if raw else "failed"
        ours_s = f"{n / sec:,.0f}" if sec else "failed"
        ratio_s = f"{raw / sec:.2f}" if raw and sec else "-"
        print(f"{m:>24,} {raw_s:>13} {ours_s:>17} {ratio_s:>6} {batches:>8}  {where}")
        for f in failed:
            print(f"  a run failed: {f}")
        if any(x["quarantined"] for x in ours):
            print("  (records were quarantined: the benchmark's events are wrong)")
    if latency:
        print(f"\ncommit -> visible in Delta at {args.rate:,} events/s for"
              f" {args.latency_seconds} s (trigger every {latency['interval_s']} s):"
              f" p50 {latency['p50_s']:.1f} s, p99 {latency['p99_s']:.1f} s,"
              f" max {latency['max_s']:.1f} s; batches: {latency['batches']},"
              f" median {latency['batch_median_s']:.1f} s; not visible at the end:"
              f" {latency['unseen']}")  # fmt: skip
    write("kafka2spark.json", {"events": n, "rounds": args.rounds, "throughput": summary,
                               "runs": rows, "latency": latency})  # fmt: skip


def latency_main(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    """The job with its defaults, fed at a steady rate; per record, produce time to the end
    of the batch that made it visible."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = new_topic(bootstrap)
    drain = 90.0
    until = time.time() + 180 + args.latency_seconds + drain
    proc = subprocess.Popen(sub("latency", topic, str(until)), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        if not ready:
            raise SystemExit("the latency job did not start")
        print(f"latency: producing {args.rate:,}/s for {args.latency_seconds} s ...",
              file=sys.stderr)  # fmt: skip
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        started = time.monotonic()
        i = 0
        while (elapsed := time.monotonic() - started) < args.latency_seconds:
            due = int(elapsed * args.rate)
            now_ts = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
            while i < due:
                k, v = change(i, commit_ts=now_ts)
                p.produce(topic, v, k)
                i += 1
            p.poll(0)
            time.sleep(0.005)
        p.flush(60)
        produced = i
        out, _ = proc.communicate(timeout=until - time.time() + 120)
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        if proc.poll() is None:
            proc.kill()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                  "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(topic, part, 0) for part in (0, 1)])
    times: list[tuple[int, int, float]] = []
    while len(times) < produced:
        msgs = c.consume(10_000, 5)
        if not msgs:
            break
        for m in msgs:
            if not m.error():
                times.append(
                    (int(m.partition() or 0), int(m.offset() or 0), m.timestamp()[1] / 1000)
                )
    c.close()
    delete_topic(bootstrap, topic)
    ends = result["batches"]
    lat: list[float] = []
    unseen = 0
    for part, offset, ts in times:
        seen = next((b["at"] for b in ends if b["offsets"].get(str(part), -1) >= offset), None)
        if seen is None:
            unseen += 1
        else:
            lat.append(seen - ts)
    lat.sort()
    if not lat:
        raise SystemExit("latency: no record became visible")
    return {"rate": args.rate, "seconds": args.latency_seconds, "produced": produced,
            "p50_s": lat[len(lat) // 2], "p99_s": lat[int(len(lat) * 0.99)], "max_s": lat[-1],
            "unseen": unseen, "batches": len(ends),
            "batch_median_s": statistics.median(b["seconds"] for b in ends) if ends else 0.0,
            "interval_s": settings_for(topic, "x", REPO).trigger.interval_s}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--max-offsets", type=int, nargs="+", default=[200_000, 50_000, 1_000_000])
    ap.add_argument("--latency-seconds", type=int, default=120)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--latency-only", action="store_true", help="only the latency measurement")
    ap.add_argument("--one-batch", action="store_true", help="time one micro-batch")
    ap.add_argument("--ref", help="with --one-batch: also time this git ref's mirror")
    ap.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inner", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="walcast", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_round:
        print(json.dumps(one_round(args.topic, args.mode)))
        return
    if args.inner:
        kind, *rest = args.inner
        if kind == "stream":
            topic, mode, events, m = rest
            print(json.dumps(stream_round(topic, mode, int(events), int(m))))
        else:
            print(json.dumps(latency_round(rest[0], float(rest[1]))))
        return

    from services.kafka2spark.settings import Kafka2SparkSettings
    from shared.settings import load_settings

    bootstrap = load_settings(Kafka2SparkSettings, env_file=env_file()).kafka.bootstrap_servers
    if args.one_batch:
        args.events = args.events or 200_000
        args.rounds = args.rounds or 3
        one_batch_main(args, bootstrap)
    else:
        args.events = args.events or 1_000_000
        args.rounds = args.rounds or 1
        stream_main(args, bootstrap)


if __name__ == "__main__":
    main()
