"""The Postgres side of ``verify`` (issue 39), alone: every range of ``pgbench_accounts``
(`pgbench -i -s N`, no pipeline needed) read by :class:`shared.verify.postgres.PostgresSource`
with one connection (one scan finds each range's bound as it hashes it) and with
``verify.workers`` connections (bounds from a walk of the key's index, ranges hashed at
once), beside ``COPY pgbench_accounts TO STDOUT`` in the same run. Each is its own process,
timed with its peak memory, alternated over ``--repeat`` rounds (the best of each kept).

    python bench/verify_source_bench.py --scale 100     # 10M accounts
    python bench/verify_source_bench.py --scale 5       # a quick run

Needs the local stack's Postgres (``deploy/local/walcast up``); uses its own schema,
dropped afterwards. Prints a table, writes ``bench/results/verify_source.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.chaos import Chaos, Config, stack_env  # noqa: E402
from bench.verify_bench import _copy, measure  # noqa: E402 - the same COPY baseline

TABLE = "pgbench_accounts"  # as bench/verify_bench.py's _copy reads
RANGE_ROWS = 10_000


def _ranges(dsn: str, schema: str, workers: str) -> None:
    from shared.verify.postgres import PostgresSource

    src = PostgresSource(dsn, workers=int(workers))
    rows = ranges = 0
    for r in src.ranges((schema, TABLE), RANGE_ROWS):
        rows += r.summary.rows
        ranges += 1
    print(json.dumps({"rows": rows, "ranges": ranges}))


def run(scale: int, repeat: int, workers: int) -> dict[str, Any]:
    c = Chaos(Config(name=f"vsb_{os.getpid()}", scale=scale, kills=0))
    c.sql(f"CREATE SCHEMA {c.schema}")
    try:
        t0 = time.monotonic()
        c.bench("-i", "-s", str(scale), "-q")
        c.sql(f"VACUUM ANALYZE {c.schema}.{TABLE}")
        load_s = time.monotonic() - t0
        rows = int(c.sql(f"SELECT count(*) FROM {c.schema}.{TABLE}")[0][0])
        me, py = str(Path(__file__).resolve()), sys.executable
        steps = {
            "copy": [py, me, "_copy", c.dsn, c.schema],
            "ranges_1": [py, me, "_ranges", c.dsn, c.schema, "1"],
            f"ranges_{workers}": [py, me, "_ranges", c.dsn, c.schema, str(workers)],
        }
        best: dict[str, dict[str, float]] = {}
        for _ in range(repeat):
            for name, cmd in steps.items():
                wall, rss, _out = measure(cmd, {})
                if name not in best or wall < best[name]["s"]:
                    best[name] = {"s": round(wall, 2), "rss_mb": round(rss),
                                  "rows_per_s": round(rows / wall)}  # fmt: skip
        many = best[f"ranges_{workers}"]["s"]
        return {"scale": scale, "rows": rows, "load_s": round(load_s, 1), "workers": workers,
                "range_rows": RANGE_ROWS, "steps": best,
                "ratio_parallel": round(best["ranges_1"]["s"] / many, 3),
                "ratio_copy": round(best["copy"]["s"] / many, 3)}  # fmt: skip
    finally:
        c.sql(f"DROP SCHEMA IF EXISTS {c.schema} CASCADE")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("_ranges", "_copy"):
        (_ranges if argv[0] == "_ranges" else _copy)(*argv[1:])  # type: ignore[operator]
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=int, default=100)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "verify_source.json")
    args = p.parse_args(argv)
    stack_env()  # fails early without the local stack
    r = run(args.scale, args.repeat, args.workers)
    print(f"\nverify_source_bench: pgbench scale {r['scale']} ({r['rows']} accounts),"
          f" ranges of {r['range_rows']} rows (best of {args.repeat})")  # fmt: skip
    print(f"| {'step':<12} | {'s':>8} | {'rows/s':>10} | {'peak RSS MB':>11} |")
    print(f"| {'-' * 12} | {'-' * 8} | {'-' * 10} | {'-' * 11} |")
    for k, v in r["steps"].items():
        print(f"| {k:<12} | {v['s']:>8} | {v['rows_per_s']:>10} | {v['rss_mb']:>11} |")
    print(f"one connection / {r['workers']}: {r['ratio_parallel']}x;"
          f" COPY / {r['workers']} connections: {r['ratio_copy']}")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
