"""Subscription write overhead: application insert throughput on a table with 0, 1 and 5
subscriptions, in the same run on the same Postgres (the 0-subscription table is the
baseline).

    .venv/bin/python bench/subscriptions_bench.py [--rows 50000] [--clients 2] [--rounds 2]
        [--compare-version 11]

Each client inserts single-row transactions (the worst case for per-row triggers: every
commit also writes its events); the table is recreated per case. Each case runs
``--rounds`` times in mirrored order and the best is kept (this host's speed drifts).
``--compare-version`` also runs every case in a second database migrated only up to that
version, so older trigger code is measured in the same run. Reported: inserts/s and the
ratio to the no-subscription baseline of the same schema. Prints a table, writes
``bench/results/subscriptions.json``. The failover replay has its own benchmark
(``bench/replay_bench.py``).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import psycopg.conninfo
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pg2kafka_bench import RESULTS, read_env
from shared.migrations import migrate


def run_case(dsn: str, schema: str, stream: int, subs: int, rows: int, clients: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {schema}.orders")
        c.execute(
            f"CREATE TABLE {schema}.orders (id bigint PRIMARY KEY, user_id int,"
            " total numeric(10,2), status text)"
        )
        for i in range(subs):
            c.execute(
                "INSERT INTO _walcast.subscriptions (key, stream_id, operation, schema_name,"
                " table_name, when_clause, column_names, payload_extensions)"
                " VALUES (%s, %s, 'INSERT', %s, 'orders', %s, %s, %s)",
                [
                    f"{schema}:sub{i}",
                    stream,
                    schema,
                    None if i == 0 else f"new.total > {i}",
                    ["id", "user_id", "total"],
                    Jsonb([{"json_path": "group_id", "expression": "new.user_id::text"}]),
                ],
            )
    per_client = rows // clients
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                base = n * per_client
                for i in range(per_client):
                    c.execute(
                        f"INSERT INTO {schema}.orders VALUES (%s, %s, %s, 'new')",
                        [base + i, (base + i) % 1000, (base + i) % 50],
                    )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - start
    if errors:
        raise errors[0]
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM _walcast.subscriptions WHERE stream_id = %s", [stream])
    return per_client * clients / took


def prepare(dsn: str, schema: str, stream: int, up_to: int | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        migrate(c, up_to=up_to)
        c.execute(f"CREATE SCHEMA {schema}")
        c.execute("INSERT INTO _walcast.streams (id) VALUES (%s)", [stream])


def cleanup(dsn: str, schema: str, stream: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM _walcast.streams WHERE id = %s", [stream])
        c.execute("DELETE FROM _walcast.events WHERE stream_id = %s", [stream])
        c.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=2, help="each case this many times, mirrored order; best kept"
    )
    parser.add_argument(
        "--compare-version",
        type=int,
        help="also run every case in a database migrated only up to this version (e.g. 11:"
        " the triggers before V012), in the same run",
    )
    args = parser.parse_args()
    dsn = read_env()["WALCAST_PG_DSN"]
    tag = uuid.uuid4().hex[:8]
    schema = f"bench_sub_{tag}"
    stream = 4 * 10**9 + uuid.uuid4().int % 10**9
    targets: list[tuple[str, str, int | None]] = [("current", dsn, None)]
    old_db = f"walcast_bench_v{args.compare_version}_{tag}"
    if args.compare_version is not None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {old_db}")
        old_dsn = psycopg.conninfo.make_conninfo(dsn, dbname=old_db)
        targets.append((f"V{args.compare_version:03d}", old_dsn, args.compare_version))
    cases = (0, 1, 5)
    results: dict[str, Any] = {"rows": args.rows, "clients": args.clients, "rounds": args.rounds}
    best: dict[tuple[str, int], float] = {}
    try:
        for _, target, up_to in targets:
            prepare(target, schema, stream, up_to)
        for r in range(args.rounds):
            order = [(t, n) for t in targets for n in cases]
            for (name, target, _), subs in order if r % 2 == 0 else reversed(order):
                print(
                    f"round {r + 1}, {name}, {subs} subscription(s):"
                    f" {args.rows:,} single-row inserts ...",
                    flush=True,
                )
                rate = run_case(target, schema, stream, subs, args.rows, args.clients)
                best[(name, subs)] = max(best.get((name, subs), 0.0), rate)
    finally:
        for _, target, _ in targets:
            cleanup(target, schema, stream)
        if args.compare_version is not None:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {old_db} WITH (FORCE)")
    print(f"\n{'schema':<10}{'subscriptions on the table':<30}{'inserts/s':>12}{'vs none':>10}")
    for name, _, _ in targets:
        base = best[(name, 0)]
        for subs in cases:
            rate = best[(name, subs)]
            results[f"{name}_subs_{subs}"] = round(rate)
            results[f"{name}_ratio_{subs}"] = round(rate / base, 3)
            print(f"{name:<10}{subs:<30}{round(rate):>12,}{rate / base:>10.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "subscriptions.json").write_text(
        orjson.dumps(results, option=orjson.OPT_INDENT_2).decode()
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
