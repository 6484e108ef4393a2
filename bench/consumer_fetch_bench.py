"""How fast a bare confluent-kafka loop reads a backlog, by librdkafka's fetch settings.

Run against the local stack (``deploy/local/walcast up`` first):

    .venv/bin/python bench/consumer_fetch_bench.py [--records 2000000]

Fills a one-partition topic with ``--records`` change events of a snapshot's shape
(~330 bytes, lz4 as pg2kafka's producer sends them), then reads it from the start with
``consume()`` + ``value()`` and nothing else, once per setting below. The baseline is
librdkafka's defaults, in the same run. ``fetch.queue.backoff.ms`` is what walcast's
consumers set (``consumer.fetch_backoff_ms``). Reported: records/s and the whole
machine's CPU per record (the consumer's and the broker's). Prints a table and writes
``bench/results/consumer_fetch.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.kafka2postgres_bench import read_env, run_consume
from shared.settings import ConsumerSettings

RESULTS = Path(__file__).resolve().parent / "results"
VALUE = (
    b'{"v":1,"op":"read","db":"walcast","schema":"public","table":"pgbench_accounts",'
    b'"lsn":123456,"key":{"aid":1},"new":{"aid":1,"bid":1,"abalance":0,"filler":"'
    + b" "
    * 84
    + b'"},"types":{"aid":"int4","bid":"int4","abalance":"int4","filler":"bpchar"},'
    b'"hash":1234,"snapshot":{"id":1,"chunk":1}}'
)
SETTINGS: list[tuple[str, dict[str, Any]]] = [
    ("librdkafka's defaults", {}),
    (
        "fetch.queue.backoff.ms as walcast's",
        {"fetch.queue.backoff.ms": ConsumerSettings().fetch_backoff_ms},
    ),
    ("queued.min.messages 1M", {"queued.min.messages": 1_000_000}),
    ("max.partition.fetch.bytes 10 MB", {"max.partition.fetch.bytes": 10 * 2**20}),
]


def fill(bootstrap: str, topic: str, records: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                  "batch.num.messages": 10_000, "compression.type": "lz4"})  # fmt: skip
    for i in range(records):
        while True:
            try:
                p.produce(topic, VALUE, key=str(i).encode())
                break
            except BufferError:
                p.poll(0.1)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--json", type=Path, default=RESULTS / "consumer_fetch.json")
    args = ap.parse_args(argv)
    bootstrap = read_env()["WALCAST_KAFKA_BOOTSTRAP"]
    topic = f"fetch-bench-{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    out: dict[str, Any] = {"records": args.records, "runs": {}}
    try:
        fill(bootstrap, topic, args.records)
        for label, extra in SETTINGS:
            out["runs"][label] = {
                "config": extra,
                **run_consume(bootstrap, topic, args.records, extra),
            }
    finally:
        admin.delete_topics([topic])
    base = out["runs"]["librdkafka's defaults"]["records_s"]
    print(f"{'':34} {'records/s':>12} {'vs defaults':>11} {'machine µs/record':>18}")
    for label, r in out["runs"].items():
        print(f"{label:34} {r['records_s']:>12,.0f} {r['records_s'] / base:>11.2f}"
              f" {r['machine_cpu_us_per_record']:>18.2f}")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
