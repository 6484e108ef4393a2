"""Snapshot throughput: ``pgbench -i -s SCALE`` tables brought into Kafka (acks=all) by
pg2kafka's initial snapshot, with 1 and with N readers, against two baselines measured in
the same run on the same data:

* ``COPY pgbench_accounts TO STDOUT``: how fast Postgres can hand the rows out at all;
* a minimal producer written without walcast code: a server-side cursor, one
  ``orjson`` message per row, ``confluent-kafka`` with lz4 and acks=all.

Each pg2kafka run is a real ``pg2kafka run`` process with ``snapshot.mode=initial_only``
(it snapshots, drops its slot and exits); rows/s is the rows of all pgbench tables over
the process's wall time (start-up included), peak RSS is the process's (``wait4``), to be
at most the memory guard (``producer.max_inflight_bytes``, its default 100 MB) + 100 MB —
summed over the process and its reader processes (RSS; PSS, which splits shared pages
between the processes, shown beside it).

    .venv/bin/python bench/snapshot_bench.py            # -s 100: 10M accounts rows
    .venv/bin/python bench/snapshot_bench.py --scale 20 # quicker

Prints a table and writes ``bench/results/snapshot_bench.json``. Needs the local stack.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
STACK = Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack"))
DB = "walcast_snapbench"
GUARD = 100 * 1024 * 1024  # producer.max_inflight_bytes' default


def stack_env() -> dict[str, str]:
    env = {}
    for line in (STACK / "walcast.env").read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            env[k] = v
    return env


def dsn(env: dict[str, str], db: str) -> str:
    return (
        f"host={env['WALCAST_PG_HOST']} port={env['WALCAST_PG_PORT']}"
        f" user={env['WALCAST_PG_USER']} password={env['WALCAST_PG_PASSWORD']} dbname={db}"
    )


def prepare(env: dict[str, str], scale: int) -> int:
    with psycopg.connect(dsn(env, env["WALCAST_PG_DATABASE"]), autocommit=True) as c:
        exists = c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB]).fetchone()
        if not exists:
            c.execute(f"CREATE DATABASE {DB}")
    with psycopg.connect(dsn(env, DB), autocommit=True) as c:
        have = c.execute("SELECT to_regclass('pgbench_accounts') IS NOT NULL").fetchone()
        rows = 0
        if have and have[0]:
            rows = int(c.execute("SELECT count(*) FROM pgbench_accounts").fetchone()[0])  # type: ignore[index]
    if rows != scale * 100_000:
        print(f"pgbench -i -s {scale} ...", flush=True)
        subprocess.run(
            ["pgbench", "-i", "-q", "-s", str(scale), "-h", env["WALCAST_PG_HOST"], "-p",
             env["WALCAST_PG_PORT"], "-U", env["WALCAST_PG_USER"], DB],
            env={**os.environ, "PGPASSWORD": env["WALCAST_PG_PASSWORD"]},
            check=True, capture_output=True,
        )  # fmt: skip
    with psycopg.connect(dsn(env, DB), autocommit=True) as c:
        c.execute("VACUUM ANALYZE")
        total = c.execute(
            "SELECT (SELECT count(*) FROM pgbench_accounts) + (SELECT count(*) FROM"
            " pgbench_branches) + (SELECT count(*) FROM pgbench_tellers)"
            " + (SELECT count(*) FROM pgbench_history)"
        ).fetchone()
    assert total is not None
    return int(total[0])


def copy_baseline(env: dict[str, str]) -> dict[str, Any]:
    with psycopg.connect(dsn(env, DB)) as c:
        started = time.perf_counter()
        n = 0
        with c.cursor().copy("COPY pgbench_accounts TO STDOUT") as cp:
            for block in cp:
                n += bytes(block).count(b"\n")
        seconds = time.perf_counter() - started
    return {"name": "COPY pgbench_accounts TO STDOUT", "rows": n, "seconds": seconds}


def topic(env: dict[str, str], name: str, create: bool = True) -> None:
    admin = AdminClient({"bootstrap.servers": env["PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS"]})
    if create:
        admin.create_topics([NewTopic(name, 6, 1)])[name].result(30)
    else:
        admin.delete_topics([name])[name].result(30)


def minimal_producer(env: dict[str, str]) -> dict[str, Any]:
    """The baseline: no walcast code (server-side cursor → JSON per row → Kafka)."""
    name = f"snapbench.minimal.{uuid.uuid4().hex[:6]}"
    topic(env, name)
    p = Producer({"bootstrap.servers": env["PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS"], "acks": "all",
                  "enable.idempotence": True, "compression.type": "lz4", "linger.ms": 20,
                  "batch.size": 1_048_576, "queue.buffering.max.messages": 1_000_000})  # fmt: skip
    started = time.perf_counter()
    n = 0
    with psycopg.connect(dsn(env, DB)) as c, c.cursor(name="rows") as cur:
        cur.itersize = 10_000
        cur.execute("SELECT aid, bid, abalance, filler FROM pgbench_accounts")
        cols = [d.name for d in cur.description or []]
        for row in cur:
            value = orjson.dumps(dict(zip(cols, row, strict=True)))
            while True:
                try:
                    p.produce(name, value, str(row[0]).encode())
                    break
                except BufferError:
                    p.poll(0.05)
            n += 1
            if n % 1000 == 0:
                p.poll(0)
    p.flush(300)
    seconds = time.perf_counter() - started
    topic(env, name, create=False)
    return {"name": "minimal producer (psycopg + orjson + confluent-kafka, lz4)", "rows": n,
            "seconds": seconds}  # fmt: skip


def tree_memory_mb(root: int) -> tuple[float, float]:
    """Resident memory (RSS, and PSS: shared pages split between their users) of
    ``root`` and every process under it (its reader processes)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [c for c, p in parents.items() if p == pid and c not in tree]
        tree.update(kids)
        frontier.extend(kids)
    rss = pss = 0
    for pid in tree:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024


def pg2kafka_run(env: dict[str, str], workers: int, rows: int) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    name = f"snapbench_{run}"
    penv = {
        **os.environ,
        "PG2KAFKA_POSTGRES__DATABASE": DB,
        "PG2KAFKA_REPLICATION__SLOT": name,
        "PG2KAFKA_REPLICATION__PUBLICATION": "snapbench",
        "PG2KAFKA_PRODUCER__TOPIC": f"snapbench.{run}",
        "PG2KAFKA_PRODUCER__CREATE_TOPIC": "true",
        "PG2KAFKA_PRODUCER__TOPIC_PARTITIONS": "6",
        "PG2KAFKA_PRODUCER__MAX_INFLIGHT_BYTES": str(GUARD),
        "PG2KAFKA_FILTERS__INCLUDE": '["public.pgbench_*"]',
        "PG2KAFKA_SNAPSHOT__MODE": "initial_only",
        "PG2KAFKA_SNAPSHOT__WORKERS": str(workers),
        "PG2KAFKA_SNAPSHOT__PROGRESS_INTERVAL_S": "5",
        "PG2KAFKA_HTTP__ENABLED": "false",
        "PG2KAFKA_LOG__FORMAT": "text",
    }
    cmd = [sys.executable, "-m", "services.pg2kafka", "--env-file", str(STACK / "walcast.env")]
    subprocess.run([*cmd, "init"], env=penv, cwd=REPO, check=True, capture_output=True)
    log = REPO / "bench" / "results" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        started = time.perf_counter()
        proc = subprocess.Popen([*cmd, "run"], env=penv, cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
        peak = peak_pss = 0.0
        while True:
            pid, status, _usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            rss, pss = tree_memory_mb(proc.pid)
            peak, peak_pss = max(peak, rss), max(peak_pss, pss)
            time.sleep(0.25)
        seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"pg2kafka run failed: {log.read_text()[-3000:]}")
    with psycopg.connect(dsn(env, DB)) as c:
        done = c.execute(
            "SELECT sum(rows_done) FROM _walcast.snapshot_tables t JOIN _walcast.snapshots s"
            " ON s.id = t.snapshot_id WHERE s.slot = %s AND s.state = 'done'",
            [name],
        ).fetchone()
    got = int(done[0]) if done and done[0] is not None else 0
    if got != rows:
        raise RuntimeError(f"the snapshot delivered {got} rows, the tables hold {rows}")
    topic(env, f"snapbench.{run}", create=False)
    return {
        "name": f"pg2kafka snapshot, {workers} reader(s)",
        "rows": got,
        "seconds": seconds,
        "workers": workers,
        "peak_rss_mb": peak,
        "peak_pss_mb": peak_pss,
        "log": str(log),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=100)
    ap.add_argument("--workers", type=int, default=max(2, min(4, os.cpu_count() or 2)))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "snapshot_bench.json"))
    args = ap.parse_args()
    env = stack_env()
    rows = prepare(env, args.scale)
    results = [copy_baseline(env), minimal_producer(env)]
    results.append(pg2kafka_run(env, 1, rows))
    results.append(pg2kafka_run(env, args.workers, rows))
    for r in results:
        r["rows_per_s"] = r["rows"] / r["seconds"]
    one, many = results[2], results[3]
    summary = {
        "scale": args.scale,
        "rows": rows,
        "guard_mb": GUARD / 2**20,
        "speedup_1_to_n": many["rows_per_s"] / one["rows_per_s"],
        "vs_minimal_producer": many["rows_per_s"] / results[1]["rows_per_s"],
        "vs_copy": many["rows_per_s"] / results[0]["rows_per_s"],
        "target_rows_per_s": 300_000,
        "rss_limit_mb": GUARD / 2**20 + 100,
        "rss_within_limit": all(
            r["peak_rss_mb"] <= GUARD / 2**20 + 100 for r in results if "peak_rss_mb" in r
        ),
        "cores": os.cpu_count(),
    }
    print(f"\nsnapshot of pgbench -s {args.scale} ({rows:,} rows), acks=all\n")
    print(f"{'run':<62} {'rows':>11} {'s':>7} {'rows/s':>10} {'RSS MB':>7} {'PSS MB':>7}")
    for r in results:
        rss = f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else "-"
        pss = f"{r['peak_pss_mb']:.0f}" if "peak_pss_mb" in r else "-"
        print(f"{r['name']:<62} {r['rows']:>11,} {r['seconds']:>7.1f}"
              f" {r['rows_per_s']:>10,.0f} {rss:>7} {pss:>7}")  # fmt: skip
    print(
        f"\n1 -> {args.workers} readers: x{summary['speedup_1_to_n']:.2f};"
        f" {args.workers} readers vs the minimal producer: x{summary['vs_minimal_producer']:.2f};"
        f" vs COPY: {summary['vs_copy']:.2f}; peak RSS within guard + 100 MB:"
        f" {summary['rss_within_limit']}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "runs": results}, indent=2))
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
