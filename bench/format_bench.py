"""What each output format costs pg2kafka: walcast JSON, Debezium JSON, walcast Avro.

Run against the local stack (``deploy/local/walcast up`` first):

    .venv/bin/python bench/format_bench.py [--events 200000] [--rounds 2]

One backlog of ``--events`` inserts (a small row: int key, int, short text; 1000-row
transactions) is written while a slot per (format, round) exists, so every run drains
the very same changes. pg2kafka (a process, ``snapshot.mode=never``) drains its slot
into a fresh one-partition topic in each format: ``walcast`` (the JSON event, the
baseline), ``debezium`` (Kafka Connect JSON with schemas, as the connector writes it by
default), ``debezium_bare`` (the same without the schema part), ``avro`` (the
walcast event in Avro, Confluent wire format) and ``debezium_avro`` (Debezium's records
as Confluent's AvroConverter writes them). For Avro the registry is confluent-kafka's
in-process ``mock://``, asked once per schema, so the figure is the encoding's cost,
not a registry's. Rounds run in mirrored order (walcast, debezium, ...,
avro, avro, ..., walcast) and the best of each counts. Reported per format:
events/s from start to the slot's confirmation of the last change, pg2kafka's CPU µs
per event, bytes per event in Kafka (key + value, from a plain consumer), each also as
a ratio to walcast JSON. Prints a table and writes ``bench/results/formats.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pg2kafka_bench import (
    RESULTS,
    Bench,
    create_table,
    drain,
    per_event_us,
    read_env,
    write_backlog,
)

FORMATS = ("walcast", "debezium", "debezium_bare", "avro", "debezium_avro")


def topic_bytes(b: Bench, topic: str) -> tuple[int, int]:
    """(records, key + value bytes) of a one-partition topic, read with a plain consumer."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"{topic}-size",
                  "enable.auto.commit": False})  # fmt: skip
    _, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    c.assign([TopicPartition(topic, 0, 0)])
    n = size = 0
    try:
        while n < high:
            for msg in c.consume(10_000, 2.0):
                if msg.error() is None:
                    n += 1
                    size += len(msg.value() or b"") + len(msg.key() or b"")
    finally:
        c.close()
    return n, size


def run_format(b: Bench, fmt: str, name: str, table: str, target: int,
               events: int) -> dict[str, Any]:  # fmt: skip
    extra: dict[str, str] = {}
    topic = name
    if fmt.startswith("debezium"):
        extra |= {"PG2KAFKA_PRODUCER__FORMAT": "debezium",
                  "PG2KAFKA_DEBEZIUM__TOPIC_PREFIX": name,
                  "PG2KAFKA_DEBEZIUM__SCHEMAS": str(fmt == "debezium").lower()}  # fmt: skip
        topic = f"{name}.public.{table}"
    if fmt.endswith("avro"):
        extra |= {"PG2KAFKA_PRODUCER__ENCODING": "avro",
                  "PG2KAFKA_SCHEMA_REGISTRY__URL": f"mock://{name}",
                  "PG2KAFKA_SCHEMA_REGISTRY__SUBJECT_NAME_STRATEGY": "topic_record"}  # fmt: skip
    b.topic(topic)
    seconds, cpu = drain(b, name, target, RESULTS / f"formats-{name}.log", **extra)
    return {"format": fmt, "topic": topic, "seconds": round(seconds, 3),
            "events_per_s": round(events / seconds),
            "cpu_us": per_event_us(cpu, events)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    b = Bench(read_env())
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        table = f"bench_fmt_{b.run_id}"
        create_table(b, "small", table)
        order = [f for r in range(args.rounds)
                 for f in (FORMATS if r % 2 == 0 else tuple(reversed(FORMATS)))]  # fmt: skip
        names = [f"bench_fmt_{fmt}_{i}_{b.run_id}" for i, fmt in enumerate(order)]
        for name in names:
            b.init_stream(name, table)
        print(f"writing a backlog of {args.events:,} inserts ...", flush=True)
        write_backlog(b, "small", table, args.events)
        target = b.lsn()
        runs = []
        for fmt, name in zip(order, names, strict=True):
            print(f"draining with pg2kafka, format {fmt} ...", flush=True)
            runs.append(run_format(b, fmt, name, table, target, args.events))
        best: dict[str, dict[str, Any]] = {}
        for r in runs:
            if r["format"] not in best or r["events_per_s"] > best[r["format"]]["events_per_s"]:
                best[r["format"]] = r
        for fmt, r in best.items():
            records, size = topic_bytes(b, r["topic"])
            if records < args.events:
                raise SystemExit(f"{fmt}: {records:,} records in Kafka for {args.events:,}")
            r["bytes_per_event"] = round(size / records, 1)
        base = best["walcast"]
        for r in best.values():
            r["throughput_vs_walcast_json"] = round(r["events_per_s"] / base["events_per_s"], 3)
            r["bytes_vs_walcast_json"] = round(r["bytes_per_event"] / base["bytes_per_event"], 3)
        print(f"\n{args.events:,} inserts, best of {args.rounds} round(s) per format")
        print(f"{'format':14} {'events/s':>9} {'vs json':>8} {'cpu µs/ev':>9} {'bytes/ev':>9}"
              f" {'vs json':>8}")  # fmt: skip
        for fmt in FORMATS:
            r = best[fmt]
            print(f"{fmt:14} {r['events_per_s']:>9,} {r['throughput_vs_walcast_json']:>8}"
                  f" {r['cpu_us']!s:>9} {r['bytes_per_event']:>9}"
                  f" {r['bytes_vs_walcast_json']:>8}")  # fmt: skip
        out = RESULTS / "formats.json"
        out.write_text(json.dumps({"events": args.events, "rounds": args.rounds,
                                   "best": best, "runs": runs}, indent=2))  # fmt: skip
        print(f"\nwritten: {out}")
    finally:
        b.close()
        b.sql(f"DROP TABLE IF EXISTS bench_fmt_{b.run_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
