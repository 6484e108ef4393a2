"""Subscription write overhead: application insert throughput on a table with 0, 1 and 5
subscriptions, in the same run on the same Postgres (the 0-subscription table is the
baseline).

    .venv/bin/python bench/subscriptions_bench.py [--rows 50000] [--clients 2]

Each client inserts single-row transactions (the worst case for per-row triggers: every
commit also writes its events); the table is recreated per case. Reported: inserts/s and
the ratio to the baseline. Prints a table, writes ``bench/results/subscriptions.json``.
The replay rate after an outage is not measured: the failover replay is not built yet.
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
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pg2kafka_bench import RESULTS, read_env
from services.pg2kafka.migrations import migrate


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=2)
    args = parser.parse_args()
    dsn = read_env()["WALCAST_PG_DSN"]
    schema = f"bench_sub_{uuid.uuid4().hex[:8]}"
    stream = 4 * 10**9 + uuid.uuid4().int % 10**9
    with psycopg.connect(dsn, autocommit=True) as c:
        migrate(c)
        c.execute(f"CREATE SCHEMA {schema}")
        c.execute("INSERT INTO _walcast.streams (id) VALUES (%s)", [stream])
    results: dict[str, Any] = {"rows": args.rows, "clients": args.clients}
    try:
        for subs in (0, 1, 5):
            print(f"{subs} subscription(s): {args.rows:,} single-row inserts ...", flush=True)
            results[f"subs_{subs}"] = round(
                run_case(dsn, schema, stream, subs, args.rows, args.clients)
            )
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DELETE FROM _walcast.streams WHERE id = %s", [stream])
            c.execute("DELETE FROM _walcast.events WHERE stream_id = %s", [stream])
            c.execute(f"DROP SCHEMA {schema} CASCADE")
    base = results["subs_0"]
    print(f"\n{'subscriptions on the table':<30}{'inserts/s':>12}{'vs none':>10}")
    for subs in (0, 1, 5):
        rate = results[f"subs_{subs}"]
        print(f"{subs:<30}{rate:>12,}{rate / base:>10.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "subscriptions.json").write_text(
        orjson.dumps(results, option=orjson.OPT_INDENT_2).decode()
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
