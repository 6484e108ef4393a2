"""kafka2webhook's delivery rate against a raw HTTP client posting the same bodies.

Run against the local stack (``deploy/local/walcast up`` first):

    .venv/bin/python bench/webhook_bench.py [--events 20000] [--keys 64] [--parallel 8]

One topic (3 partitions) is filled with ``--events`` change events over ``--keys`` row
keys. A receiver (a threaded HTTP/1.1 server, a process of its own, answering 204) counts
what arrives. Baseline: a raw client — urllib3, ``--parallel`` threads with keep-alive
connections — posts the very same bodies to it, unsigned, nothing else. Then
kafka2webhook (a process; one endpoint, ``delivery.parallel_keys = --parallel``, one POST
per event) consumes the topic from the start and delivers everything, signed, in per-key
order, committing offsets as it goes; timed from start until the receiver counted every
event. Reported: deliveries/s of each, the ratio, kafka2webhook's CPU µs per delivery.
Prints a table and writes ``bench/results/webhook.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import urllib3
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pg2kafka_bench import RESULTS, STATE, cpu_s, read_env

REPO = Path(__file__).resolve().parents[1]
SECRET = "bench-webhook-signing-secret"  # noqa: S105 - a throwaway key of the bench


def serve(port: Any, count: Any) -> None:
    """The receiver (its own process, so it does not share a GIL with either client)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            with count.get_lock():
                count.value += 1
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port.value = server.server_address[1]
    server.serve_forever()


def bodies(events: int, keys: int) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(events):
        row = i % keys
        out.append((f"public.orders.{row}".encode(), orjson.dumps({
            "v": 1, "op": "update", "db": "walcast", "schema": "public", "table": "orders",
            "lsn": 10_000 + i, "seq": 0, "commit_lsn": 10_000 + i, "xid": 1,
            "commit_ts": "2026-01-01T00:00:00.000000Z", "key": {"id": row},
            "new": {"id": row, "status": "paid", "total": "99.90", "n": i}, "old": None,
            "types": {"id": "int4", "status": "text", "total": "numeric", "n": "int4"},
        })))  # fmt: skip
    return out


def wait_count(count: Any, target: int, timeout: float = 900) -> float:
    deadline = time.monotonic() + timeout
    while count.value < target:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {count.value} of {target} arrived within {timeout}s")
        time.sleep(0.01)
    return time.monotonic()


def raw(url: str, records: list[tuple[bytes, bytes]], parallel: int, count: Any) -> float:
    pool = urllib3.PoolManager(maxsize=parallel, block=True)
    lanes: list[list[bytes]] = [[] for _ in range(parallel)]
    for i, (_k, v) in enumerate(records):
        lanes[i % parallel].append(v)

    def post(lane: list[bytes]) -> None:
        for body in lane:
            headers = {"content-type": "application/json"}
            r = pool.request("POST", url, body=body, headers=headers, retries=False)
            assert r.status == 204

    start = count.value
    began = time.monotonic()
    threads = [threading.Thread(target=post, args=(lane,)) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ended = wait_count(count, start + len(records))
    return ended - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    env = read_env()
    bootstrap = env["WALCAST_KAFKA_BOOTSTRAP"]
    run_id = os.urandom(4).hex()
    topic, dlq = f"bench_webhook_{run_id}", f"bench_webhook_{run_id}.dlq"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    port, count = mp.Value("i", 0), mp.Value("q", 0)
    receiver = mp.Process(target=serve, args=(port, count), daemon=True)
    receiver.start()
    while port.value == 0:
        time.sleep(0.01)
    url = f"http://127.0.0.1:{port.value}/hook"
    RESULTS.mkdir(parents=True, exist_ok=True)
    proc: subprocess.Popen[bytes] | None = None
    try:
        records = bodies(args.events, args.keys)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for key, value in records:
            p.produce(topic, value, key)
            p.poll(0)
        p.flush(60)
        print(f"raw client: posting {args.events:,} bodies with {args.parallel} threads ...",
              flush=True)  # fmt: skip
        raw_s = raw(url, records, args.parallel, count)

        print("kafka2webhook: delivering the topic ...", flush=True)
        before = count.value
        log = RESULTS / "webhook-kafka2webhook.log"
        started = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.kafka2webhook", "--env-file",
                 str(STATE / "walcast.env"), "run"],
                env={**os.environ,
                     "KAFKA2WEBHOOK_CONSUMER__TOPICS": json.dumps([topic]),
                     "KAFKA2WEBHOOK_CONSUMER__GROUP_ID": f"bench-{run_id}",
                     "KAFKA2WEBHOOK_CONSUMER__DLQ_TOPIC": dlq,
                     "KAFKA2WEBHOOK_ENDPOINTS": json.dumps([{"name": "bench", "url": url}]),
                     "KAFKA2WEBHOOK_SECRETS__BENCH": SECRET,
                     "KAFKA2WEBHOOK_DELIVERY__PARALLEL_KEYS": str(args.parallel),
                     "KAFKA2WEBHOOK_HTTP__PORT": "0",
                     "KAFKA2WEBHOOK_LOG__FORMAT": "text"},
                stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip
        ended = wait_count(count, before + args.events)
        cpu = cpu_s(proc.pid)
        ours_s = ended - started
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        receiver.terminate()
        for fut in admin.delete_topics([topic, dlq]).values():
            with contextlib.suppress(Exception):  # the dead-letter topic may not exist
                fut.result(30)
    result = {
        "events": args.events, "keys": args.keys, "parallel": args.parallel,
        "raw_s": round(raw_s, 3), "raw_per_s": round(args.events / raw_s),
        "kafka2webhook_s": round(ours_s, 3), "kafka2webhook_per_s": round(args.events / ours_s),
        "ratio": round(raw_s / ours_s, 3),
        "kafka2webhook_cpu_us": None if cpu is None else round(cpu / args.events * 1e6, 1),
    }  # fmt: skip
    print(f"\n{args.events:,} events over {args.keys} keys, {args.parallel} in parallel")
    print(f"{'client':<34}{'deliveries/s':>14}{'seconds':>10}")
    print(f"{'raw urllib3 client (unsigned)':<34}{result['raw_per_s']:>14,}{result['raw_s']:>10}")
    print(f"{'kafka2webhook (from start)':<34}{result['kafka2webhook_per_s']:>14,}"
          f"{result['kafka2webhook_s']:>10}")  # fmt: skip
    print(
        f"ratio {result['ratio']}; kafka2webhook CPU {result['kafka2webhook_cpu_us']} µs/delivery"
    )
    out = RESULTS / "webhook.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
