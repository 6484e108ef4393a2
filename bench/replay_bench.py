"""Failover replay rate: how fast pg2kafka drains a replay queue into Kafka.

    .venv/bin/python bench/replay_bench.py [--events 1000000]

Sets up the state an outage of ``--events`` events leaves behind (the events in
``_walcast.events``, their order in ``_walcast.replay_queue``, a failover checkpoint on
the stream), starts ``pg2kafka run`` and times it until the queue is empty and the stream
is live again. Baseline in the same run: the same COPY read of the queue with nothing
sent (the read limit). Prints a table, writes ``bench/results/replay.json``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pg2kafka_bench import RESULTS, STATE, cpu_s, per_event_us, read_env
from services.pg2kafka import admin
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.errors import PermanentError
from shared.settings import load_settings


def replay_span(log: Path, stream: int) -> float:
    """Seconds from the replay's start to the stream being live again, by the service's
    own log (one clock): what the replay costs, without the process start (~1-2 s of
    imports and connections) that the outer timing includes."""
    stamps: dict[str, datetime] = {}
    for line in log.read_text(errors="replace").splitlines():
        for mark, text in (
            ("start", f"subscription stream {stream}: replaying"),
            ("end", f"subscription stream {stream}: replay done"),
        ):
            if text in line and mark not in stamps:
                stamps[mark] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    if len(stamps) < 2:
        raise SystemExit(f"the replay's start and end are not both in {log}")
    return (stamps["end"] - stamps["start"]).total_seconds()


def tear_down(settings: Pg2KafkaSettings) -> None:
    """Drop the CDC slot once its walsender noticed pg2kafka is gone (it may take a moment
    after the process exited)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.tear_down(settings)
            return
        except PermanentError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument(
        "--replay-batch", type=int, help="subscriptions.replay_batch (default: the setting's)"
    )
    args = parser.parse_args()
    env = read_env()
    dsn = env["WALCAST_PG_DSN"]
    run = uuid.uuid4().hex[:8]
    stream = 7 * 10**9 + uuid.uuid4().int % 10**9
    sub = {
        "enabled": True,
        "stream_id": stream,
        "slot": f"bench_replay_{run}",
        "publication": f"bench_replay_{run}",
        "topic": f"bench.replay.{run}",
        **({"replay_batch": args.replay_batch} if args.replay_batch else {}),
    }
    overrides = {
        "replication": {"slot": f"bench_rcdc_{run}", "publication": f"bench_rcdc_{run}"},
        "filters": {"include": [f"public.bench_none_{run}"]},
        "producer": {"topic": f"bench.rcdc.{run}", "create_topic": True, "topic_partitions": 1},
        "subscriptions": sub,
        "snapshot": {"mode": "never"},  # init creates the CDC slot; run streams it
    }
    settings = load_settings(Pg2KafkaSettings, env_file=STATE / "walcast.env", **overrides)
    admin.init(settings)
    try:
        print(f"preparing {args.events:,} queued events ...", flush=True)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                "WITH e AS (INSERT INTO _walcast.events (payload, metadata, stream_id)"
                " SELECT jsonb_build_object('tg_name', 'bench', 'n', g, 'group_id', g %% 100),"
                ' \'{"topic": "bench"}\'::jsonb, %s FROM generate_series(1, %s::int) g'
                " RETURNING id, created_at)"
                " INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
                " SELECT %s, created_at, id FROM e ORDER BY id",
                [stream, args.events, stream],
            )
            c.execute(
                "UPDATE _walcast.streams SET failover_checkpoint ="
                ' \'{"reason": "benchmark"}\' WHERE id = %s',
                [stream],
            )
            started = time.monotonic()
            n = 0
            with (
                c.cursor() as cur,
                cur.copy(
                    "COPY (SELECT q.seq, e.id, e.payload::text, e.metadata::text FROM"
                    f" _walcast.replay_queue q JOIN _walcast.events e ON e.created_at ="
                    f" q.event_created_at AND e.id = q.event_id WHERE q.stream_id = {stream}"
                    " ORDER BY q.seq) TO STDOUT"
                ) as copy,
            ):
                for _ in copy:
                    n += 1
            read_s = time.monotonic() - started
        print("replaying with pg2kafka ...", flush=True)
        penv = {
            **os.environ,
            "PG2KAFKA_LOG__FORMAT": "text",
            "PG2KAFKA_HTTP__PORT": "0",
            "PG2KAFKA_REPLICATION__SLOT": f"bench_rcdc_{run}",
            "PG2KAFKA_REPLICATION__PUBLICATION": f"bench_rcdc_{run}",
            "PG2KAFKA_SNAPSHOT__MODE": "never",  # streaming only: what it measures
            "PG2KAFKA_FILTERS__INCLUDE": f'["public.bench_none_{run}"]',
            "PG2KAFKA_PRODUCER__TOPIC": f"bench.rcdc.{run}",
            **{
                f"PG2KAFKA_SUBSCRIPTIONS__{k.upper()}": str(v).lower() if v is True else str(v)
                for k, v in sub.items()
            },
        }
        log = RESULTS / "replay-pg2kafka.log"
        RESULTS.mkdir(parents=True, exist_ok=True)
        broker = int((STATE / "kafka" / "pid").read_text())
        broker_start = cpu_s(broker)
        started = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "services.pg2kafka",
                    "--env-file",
                    str(STATE / "walcast.env"),
                    "run",
                ],
                env=penv,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while True:
                    row = c.execute(
                        "SELECT failover_checkpoint FROM _walcast.streams WHERE id = %s", [stream]
                    ).fetchone()
                    if row is not None and row[0] is None:
                        break
                    if proc.poll() is not None:
                        raise SystemExit(f"pg2kafka exited; see {log}")
                    time.sleep(0.2)
            replay_s = time.monotonic() - started
            ours_cpu = cpu_s(proc.pid)  # with the process start: ~1 s of imports
            broker_end = cpu_s(broker)
            broker_cpu = (
                broker_end - broker_start
                if broker_end is not None and broker_start is not None
                else None
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DELETE FROM _walcast.replay_queue WHERE stream_id = %s", [stream])
            c.execute("DELETE FROM _walcast.events WHERE stream_id = %s", [stream])
            c.execute("DELETE FROM _walcast.streams WHERE id = %s", [stream])
        tear_down(settings)
    replay_only_s = replay_span(log, stream)
    results = {
        "events": args.events,
        "copy_read_events_per_s": round(n / read_s),
        "replay_events_per_s": round(args.events / replay_only_s),
        "ratio": round(read_s / replay_only_s, 3),
        "replay_s": round(replay_only_s, 2),
        "with_process_start_s": round(replay_s, 2),
        "with_process_start_events_per_s": round(args.events / replay_s),
        # CPU µs per event: the broker's work for acks=all records is on the same two
        # cores as pg2kafka and Postgres, and the COPY read baseline does not pay it.
        "pg2kafka_cpu_us": per_event_us(ours_cpu, args.events),
        "broker_cpu_us": per_event_us(broker_cpu, args.events),
        "replay_batch": settings.subscriptions.replay_batch,
    }
    print(f"\n{'measure':<40}{'events/s':>12}")
    print(f"{'COPY read of the queue (baseline)':<40}{results['copy_read_events_per_s']:>12,}")
    print(f"{'pg2kafka replay into Kafka (acks=all)':<40}{results['replay_events_per_s']:>12,}")
    print(f"{'  the same with process start':<40}{results['with_process_start_events_per_s']:>12,}")
    print(f"{'ratio':<40}{results['ratio']:>12}")
    print(f"{'CPU/event pg2kafka, µs (with start)':<40}{results['pg2kafka_cpu_us']:>12}")
    print(f"{'CPU/event Kafka broker, µs':<40}{results['broker_cpu_us']:>12}")
    print(f"{'subscriptions.replay_batch':<40}{results['replay_batch']:>12,}")
    (RESULTS / "replay.json").write_text(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
