"""Replication driver comparison: psycopg 3 (libpq COPY_BOTH via ``psycopg.pq``) against
psycopg2's ``LogicalReplicationConnection``, draining the same pgoutput backlog.

    .venv/bin/pip install psycopg2-binary   # only this benchmark needs it
    .venv/bin/python bench/replication_drivers.py [--events 300000]

Both read the raw stream and decode nothing (what differs is the driver); ``pg_recvlogical``
runs too, as the ceiling. Prints a table, writes ``bench/results/replication_drivers.json``.
The decision it informs is in docs/decisions.md.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pg2kafka_bench import RESULTS, pg_bin, read_env
from services.pg2kafka.replication import PostgresReplicationSource


def slot_sql(dsn: str, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(statement, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def drain_psycopg3(dsn: str, slot: str, pub: str, target: int) -> tuple[float, int]:
    src = PostgresReplicationSource(dsn, slot, pub, status_interval_s=1)
    start = time.monotonic()
    src.start()
    n = 0
    while src.received_lsn < target:
        n += len(src.poll_batch(5000, 5.0))
    took = time.monotonic() - start
    src.close()
    return took, n


def drain_psycopg2(dsn: str, slot: str, pub: str, target: int) -> tuple[float, int]:
    import psycopg2
    import psycopg2.extras

    start = time.monotonic()
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    cur.start_replication(
        slot_name=slot, decode=False, options={"proto_version": "1", "publication_names": pub}
    )
    count = [0]

    class DrainedError(Exception):
        """Raised from the callback: psycopg2's way out of consume_stream."""

    def consume(msg: Any) -> None:
        count[0] += 1
        if msg.data_start >= target:
            raise DrainedError

    with contextlib.suppress(DrainedError):
        cur.consume_stream(consume)
    took = time.monotonic() - start
    conn.close()
    return took, count[0]


def drain_recvlogical(dsn: str, slot: str, pub: str, target: int) -> tuple[float, int]:
    start = time.monotonic()
    subprocess.run(
        [
            pg_bin("pg_recvlogical"),
            "-d",
            dsn,
            "--slot",
            slot,
            "--start",
            "-o",
            "proto_version=1",
            "-o",
            f"publication_names={pub}",
            "-f",
            "/dev/null",
            "-E",
            f"{target >> 32:X}/{target & 0xFFFFFFFF:X}",
            "--no-loop",
        ],
        check=True,
    )
    return time.monotonic() - start, 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    args = parser.parse_args()
    dsn = read_env()["WALCAST_PG_DSN"]
    run = uuid.uuid4().hex[:8]
    table = f"bench_drv_{run}"
    drivers = {
        "pg_recvlogical": drain_recvlogical,
        "psycopg3 (pq COPY_BOTH)": drain_psycopg3,
        "psycopg2 LogicalReplicationConnection": drain_psycopg2,
    }
    slots = {name: f"bench_drv_{run}_{i}" for i, name in enumerate(drivers)}
    slot_sql(dsn, f"CREATE TABLE {table} (id int PRIMARY KEY, n int, s text)")
    slot_sql(dsn, f"CREATE PUBLICATION {table} FOR TABLE {table}")
    for slot in slots.values():
        slot_sql(dsn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    results: dict[str, Any] = {}
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            for lo in range(1, args.events + 1, 1000):
                c.execute(
                    f"INSERT INTO {table} SELECT g, g, 'row ' || g FROM generate_series("
                    "%s::int, %s::int) g",
                    [lo, min(lo + 999, args.events)],
                )
        target = int(slot_sql(dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        for name, drain in drivers.items():
            took, _ = drain(dsn, slots[name], table, target)
            results[name] = {"seconds": round(took, 3), "events_per_s": round(args.events / took)}
    finally:
        for slot in slots.values():
            slot_sql(dsn, "SELECT pg_drop_replication_slot(%s)", [slot])
        slot_sql(dsn, f"DROP PUBLICATION {table}")
        slot_sql(dsn, f"DROP TABLE {table}")
    base = results["pg_recvlogical"]["seconds"]
    print(f"\n{'driver':<40}{'events/s':>12}{'vs pg_recvlogical':>20}")
    for name, r in results.items():
        print(f"{name:<40}{r['events_per_s']:>12,}{base / r['seconds']:>20.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "replication_drivers.json").write_text(
        orjson.dumps({"events": args.events, **results}, option=orjson.OPT_INDENT_2).decode()
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
