"""What transform rules cost pg2kafka: 0, 1 and 10 column rules on the same backlog.

Run against the local stack (``deploy/local/walcast up`` first):

    .venv/bin/python bench/transforms_bench.py [--events 200000] [--rounds 2]

One backlog of ``--events`` inserts into a table of an int key and ten short text columns
(~25 characters each, 1000-row transactions) is written while a slot per (rule set,
round) exists, so every run drains the very same changes. pg2kafka (a process,
``snapshot.mode=never``) drains each slot into a fresh one-partition topic with 0 rules
(the baseline), 1 rule (``hash`` on one column) or 10 rules (one per text column, every
action: hash, mask, redact, truncate, null, drop, fake email, fake phone, hash, mask).
Rounds run in mirrored order (0, 1, 10, 10, 1, 0) and the best of each counts. Reported
per rule set: events/s from start to the slot's confirmation of the last change,
pg2kafka's CPU µs per event, and the ratio to 0 rules; every topic's record count is
checked. Prints a table and writes ``bench/results/transforms.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pg2kafka_bench import RESULTS, Bench, drain, per_event_us, read_env

RULE_SETS = (0, 1, 10)
HASH_KEY = "bench-transforms-hash-key"


def rules(table: str, count: int) -> list[dict[str, Any]]:
    every = [
        {"action": "hash"},
        {"action": "mask", "keep": 4},
        {"action": "redact"},
        {"action": "truncate", "length": 5},
        {"action": "null"},
        {"action": "drop"},
        {"action": "fake", "kind": "email"},
        {"action": "fake", "kind": "phone"},
        {"action": "hash"},
        {"action": "mask", "keep": 2, "keep_from": "start"},
    ]
    return [{"column": f"public.{table}.c{i}", **every[i]} for i in range(count)]


def write_backlog(b: Bench, table: str, events: int) -> None:
    values = ", ".join(
        "'user' || g || '@example.com'" if i == 6 else
        "'+44 20 7946 ' || lpad((g %% 10000)::text, 4, '0')" if i == 7 else
        f"md5((g + {i})::text)"
        for i in range(10)
    )  # fmt: skip
    with psycopg.connect(b.dsn, autocommit=True) as c:
        for lo in range(1, events + 1, 1000):
            c.execute(
                f"INSERT INTO {table} SELECT g, {values} FROM generate_series(%s::int, %s::int) g",
                [lo, min(lo + 999, events)],
            )


def records(b: Bench, topic: str) -> int:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": f"{topic}-count"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    b = Bench(read_env())
    RESULTS.mkdir(parents=True, exist_ok=True)
    table = f"bench_tf_{b.run_id}"
    try:
        order = [n for r in range(args.rounds)
                 for n in (RULE_SETS if r % 2 == 0 else tuple(reversed(RULE_SETS)))]  # fmt: skip
        names = [f"bench_tf_{n}_{i}_{b.run_id}" for i, n in enumerate(order)]
        print(f"writing a backlog of {args.events:,} inserts ...", flush=True)
        cols = ", ".join(f"c{i} text" for i in range(10))
        b.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, {cols})")
        for name in names:  # slots first: each sees every change
            b.init_stream(name, table)
        write_backlog(b, table, args.events)
        target = b.lsn()
        runs = []
        for n, name in zip(order, names, strict=True):
            print(f"draining with pg2kafka, {n} rule(s) ...", flush=True)
            b.topic(name)
            extra = {
                "PG2KAFKA_FILTERS__INCLUDE": json.dumps([f"public.{table}"]),
                "PG2KAFKA_TRANSFORMS__RULES": json.dumps(rules(table, n)),
                "PG2KAFKA_TRANSFORMS__HASH_KEY": HASH_KEY,
            }
            seconds, cpu = drain(b, name, target, RESULTS / f"transforms-{name}.log", **extra)
            got = records(b, name)
            if got < args.events:
                raise SystemExit(f"{n} rules: {got:,} records in Kafka for {args.events:,}")
            runs.append({"rules": n, "seconds": round(seconds, 3),
                         "events_per_s": round(args.events / seconds),
                         "cpu_us": per_event_us(cpu, args.events)})  # fmt: skip
        best: dict[int, dict[str, Any]] = {}
        for r in runs:
            if r["rules"] not in best or r["events_per_s"] > best[r["rules"]]["events_per_s"]:
                best[r["rules"]] = r
        base = best[0]
        for r in best.values():
            r["vs_no_rules"] = round(r["events_per_s"] / base["events_per_s"], 3)
        print(f"\n{args.events:,} inserts (int key + 10 text columns), best of {args.rounds}")
        print(f"{'rules':>5} {'events/s':>9} {'vs 0 rules':>10} {'cpu µs/ev':>9}")
        for n in RULE_SETS:
            r = best[n]
            print(f"{n:>5} {r['events_per_s']:>9,} {r['vs_no_rules']:>10} {r['cpu_us']!s:>9}")
        out = RESULTS / "transforms.json"
        out.write_text(json.dumps({"events": args.events, "rounds": args.rounds,
                                   "best": best, "runs": runs}, indent=2))  # fmt: skip
        print(f"\nwritten: {out}")
    finally:
        b.close()
        b.sql(f"DROP TABLE IF EXISTS {table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
