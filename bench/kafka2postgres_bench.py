"""kafka2postgres's apply rate, beside baselines in the same run.

Run against the local stack (``deploy/local/walcast up`` first):

    .venv/bin/python bench/kafka2postgres_bench.py [--snapshot-rows 10000000] [--events 1000000]

The topic (one partition) holds walcast change events as pg2kafka writes them, made
here so that every contender reads the very same records: the CREATE TABLE events of
pgbench's three keyed tables, a snapshot of ``--snapshot-rows`` accounts (``read`` rows,
then its end marker), then ``--events`` TPC-B changes (per transaction an update of a
random account, of its teller and of its branch; pgbench_history has no key and is left
out, as pg2kafka leaves keyless tables out by default). Contenders, each into a fresh
target database on the stack's server (the same two cores):

- ``kafka2postgres``: the service as a process (``run``), from the topic's start until
  its group committed the topic's end; its CPU (user + system) and peak RSS from /proc;
- ``minimal``: a minimal applier keeping none of the guarantees — one consumer, per
  change ``INSERT ... ON CONFLICT DO UPDATE`` / ``DELETE`` by psycopg's pipelined
  ``executemany``, 1,000 changes per transaction;
- ``copy``: the snapshot's rows COPYed into an empty table (the write limit for rows);
- ``copy_versioned``: the same COPY plus, in its transaction, one version per row COPYed
  into kafka2postgres's bookkeeping table (``_walcast_target.rows``, made by its
  migrations): the server's work for a snapshot that keeps a version per row;
- ``consume``: the snapshot's records read by a bare loop (``consume``, ``value()``).

From the last two: the ceiling of any snapshot that keeps a version per row and reads
the topic through confluent-kafka on this machine — the cores over the server's CPU per
row plus the machine's per bare record read (consumer and broker), with nothing left for
decoding, checking or encoding.

Reported: the snapshot phase (rows/s) and the TPC-B phase (events/s) of each, CPU µs per
event of the client process and of the whole machine (server and broker included), peak
RSS, and the ratios the targets are stated in (kafka2postgres / minimal, snapshot / copy,
copy_versioned / copy). Prints a table and writes
``bench/results/kafka2postgres.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.settings import ConsumerSettings

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
FILLER = " " * 84
TYPES = {
    "pgbench_accounts": {"aid": "int4", "bid": "int4", "abalance": "int4", "filler": "bpchar"},
    "pgbench_tellers": {"tid": "int4", "bid": "int4", "tbalance": "int4", "filler": "bpchar"},
    "pgbench_branches": {"bid": "int4", "bbalance": "int4", "filler": "bpchar"},
}
KEYS = {"pgbench_accounts": "aid", "pgbench_tellers": "tid", "pgbench_branches": "bid"}
SQL_TYPES = {"int4": "integer", "bpchar": "character(84)"}
FETCH_BACKOFF_MS = ConsumerSettings().fetch_backoff_ms  # every reader fetches as walcast's do


def read_env() -> dict[str, str]:
    env = {}
    for line in (REPO / ".stack" / "walcast.env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            env[k] = v
    return env


class Events:
    """The topic's records, in order: versions (LSNs) rise with each change."""

    def __init__(self, producer: Producer, topic: str, schema: str) -> None:
        self.p, self.topic, self.schema = producer, topic, schema
        self.lsn = 1_000_000
        self.n = 0

    def send(self, op: str, table: str, row: dict[str, Any] | None, lsn: int | None = None,
             **extra: Any) -> None:  # fmt: skip
        """One event at the next LSN (``lsn``: a snapshot's, as pg2kafka versions them)."""
        if lsn is None:
            self.lsn += 8
            lsn = self.lsn
        ev: dict[str, Any] = {
            "v": 1, "op": op, "db": "bench", "schema": self.schema, "table": table,
            "lsn": lsn, "seq": 0, "commit_lsn": lsn, "xid": lsn // 8,
            "commit_ts": "2026-11-28T00:00:00+00:00",
        }  # fmt: skip
        if row is not None:
            ev["key"] = {KEYS[table]: row[KEYS[table]]}
            ev["new"] = row
            ev["types"] = TYPES[table]
        ev.update(extra)
        value = orjson.dumps(ev)
        while True:
            try:
                self.p.produce(self.topic, value)
                break
            except BufferError:
                self.p.poll(0.1)
        self.n += 1
        if self.n % 10_000 == 0:
            self.p.poll(0)


def fill_topic(
    bootstrap: str, topic: str, schema: str, rows: int, events: int,
    expected: dict[str, tuple[int, int]],
) -> int:  # fmt: skip
    """The records; returns how many the snapshot took, and fills ``expected``: each
    table's rows and balance total once every record is applied."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4",
                  "queue.buffering.max.messages": 1_000_000})  # fmt: skip
    e = Events(p, schema=schema, topic=topic)
    for table, types in TYPES.items():
        cols = [{"name": c, "type": t, "sql_type": SQL_TYPES[t], "nullable": c != KEYS[table],
                 "num": i + 1} for i, (c, t) in enumerate(types.items())]  # fmt: skip
        e.send("ddl", table, None, ddl={"tag": "CREATE TABLE", "statement": None,
                                        "columns": cols, "primary_key": [KEYS[table]]})  # fmt: skip
    branches = max(1, rows // 100_000)
    tellers = branches * 10
    # pg2kafka's versions: a read row carries its chunk's (one per chunk, rising), the
    # markers the snapshot's start S, the lowest; the changes come after every chunk
    snap = e.lsn + 8
    chunk_rows = 5000
    for b in range(1, branches + 1):
        e.send("read", "pgbench_branches", {"bid": b, "bbalance": 0, "filler": FILLER},
               lsn=snap, snapshot={"id": snap, "chunk": 0})  # fmt: skip
    for t in range(1, tellers + 1):
        e.send("read", "pgbench_tellers",
               {"tid": t, "bid": (t - 1) // 10 + 1, "tbalance": 0, "filler": FILLER},
               lsn=snap, snapshot={"id": snap, "chunk": 0})  # fmt: skip
    for a in range(1, rows + 1):
        chunk = a // chunk_rows
        e.send("read", "pgbench_accounts",
               {"aid": a, "bid": (a - 1) // 100_000 + 1, "abalance": 0, "filler": FILLER},
               lsn=snap + 8 * chunk, snapshot={"id": snap, "chunk": chunk})  # fmt: skip
    e.lsn = snap + 8 * (rows // chunk_rows + 1)
    for table in TYPES:
        e.send("snapshot", table, None, lsn=snap,
               snapshot={"id": snap, "phase": "end", "rows": rows})  # fmt: skip
    snapshot_records = e.n
    rng = random.Random(7)  # noqa: S311 - a workload, not a secret
    balances: dict[tuple[str, int], int] = {}
    for _ in range(events // 3):
        aid, tid, bid = rng.randint(1, rows), rng.randint(1, tellers), rng.randint(1, branches)
        delta = rng.randint(-5000, 5000)
        for table, key, row in (
            ("pgbench_accounts", aid, {"aid": aid, "bid": (aid - 1) // 100_000 + 1}),
            ("pgbench_tellers", tid, {"tid": tid, "bid": (tid - 1) // 10 + 1}),
            ("pgbench_branches", bid, {"bid": bid}),
        ):
            balances[(table, key)] = balances.get((table, key), 0) + delta
            col = {"pgbench_accounts": "abalance", "pgbench_tellers": "tbalance",
                   "pgbench_branches": "bbalance"}[table]  # fmt: skip
            e.send("update", table, {**row, col: balances[(table, key)], "filler": FILLER})
    p.flush(120)
    expected.update(
        {t: (n, sum(v for (tt, _), v in balances.items() if tt == t)) for t, n in
         (("pgbench_accounts", rows), ("pgbench_tellers", tellers),
          ("pgbench_branches", branches))}
    )  # fmt: skip
    return snapshot_records


def target_state(dsn: str) -> dict[str, tuple[int, int]]:
    """Each table's rows and balance total in a target (what the topic must leave)."""
    out = {}
    with psycopg.connect(dsn) as c:
        for table, col in (("pgbench_accounts", "abalance"), ("pgbench_tellers", "tbalance"),
                           ("pgbench_branches", "bbalance")):  # fmt: skip
            n, total = c.execute(
                f"SELECT count(*), coalesce(sum({col}), 0) FROM {table}"
            ).fetchone()  # type: ignore[misc]
            out[table] = (int(n), int(total))
    return out


class Target:
    def __init__(self, admin_dsn: str, label: str) -> None:
        self.name = f"k2p_bench_{label}_{uuid.uuid4().hex[:6]}"
        self.admin = admin_dsn
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.name}"')
        self.dsn = admin_dsn.rsplit("/", 1)[0] + f"/{self.name}"

    def drop(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def committed(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
        return max(tp.offset, 0)
    finally:
        c.close()


def proc_stats(pid: int) -> tuple[float, int]:
    """(CPU seconds user + system, peak RSS bytes) of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return cpu, hwm


def run_kafka2postgres(env: dict[str, str], bootstrap: str, topic: str, target: Target,
                       snapshot_end: int, end: int) -> dict[str, Any]:  # fmt: skip
    group = f"{topic}-k2p-{uuid.uuid4().hex[:6]}"
    penv = {**os.environ, **{k: v for k, v in env.items() if k.startswith("KAFKA2POSTGRES_")},
            "KAFKA2POSTGRES_CONSUMER__TOPICS": json.dumps([topic]),
            "KAFKA2POSTGRES_CONSUMER__GROUP_ID": group,
            "KAFKA2POSTGRES_CONSUMER__DLQ_TOPIC": f"{topic}.dlq",
            "KAFKA2POSTGRES_TARGET__POSTGRES__DATABASE": target.name,
            "KAFKA2POSTGRES_HTTP__ENABLED": "false",
            "KAFKA2POSTGRES_LOG__LEVEL": "WARNING"}  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "services.kafka2postgres", "run"],
                            env=penv, cwd=REPO)  # fmt: skip
    snap_s = None
    snap_cpu = snap_busy = busy = 0.0
    peak = 0
    try:
        while True:
            done = committed(bootstrap, group, topic)
            cpu, peak = proc_stats(proc.pid)
            if snap_s is None and done >= snapshot_end:
                snap_s, snap_cpu = time.monotonic() - started, cpu
                snap_busy = machine_busy_s()
            if done >= end:
                total = time.monotonic() - started
                busy = machine_busy_s() - snap_busy
                break
            if proc.poll() is not None:
                raise RuntimeError(f"kafka2postgres exited with {proc.returncode}")
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(60)
    assert snap_s is not None
    return {"snapshot_s": snap_s, "total_s": total, "snapshot_cpu_s": snap_cpu,
            "cpu_s": cpu, "peak_rss_mb": peak / 2**20, "changes_machine_cpu_s": busy}  # fmt: skip


def run_minimal(
    bootstrap: str, topic: str, target: Target, snapshot_end: int, end: int
) -> dict[str, Any]:
    """Per change a statement (pipelined executemany), 1,000 per transaction; no versions,
    no TOAST, no schema changes beyond creating the three tables."""
    with psycopg.connect(target.dsn, autocommit=True) as c:
        for table, types in TYPES.items():
            cols = ", ".join(f"{n} {SQL_TYPES[t]}" for n, t in types.items())
            c.execute(f"CREATE TABLE {table} ({cols}, PRIMARY KEY ({KEYS[table]}))")
    stmts = {}
    for table, types in TYPES.items():
        names = list(types)
        sets = ", ".join(f"{n} = excluded.{n}" for n in names if n != KEYS[table])
        stmts[table] = (
            f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))})"
            f" ON CONFLICT ({KEYS[table]}) DO UPDATE SET {sets}",
            names,
        )
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-min",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "fetch.queue.backoff.ms": FETCH_BACKOFF_MS})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    t0 = time.monotonic()
    c0 = time.process_time()
    snap_s = snap_cpu = snap_busy = 0.0
    seen = 0
    with psycopg.connect(target.dsn) as conn:
        pending: dict[str, list[tuple[Any, ...]]] = {}
        n_pending = 0

        def flush() -> None:
            nonlocal n_pending
            with conn.cursor() as cur:
                for table, rows in pending.items():
                    cur.executemany(stmts[table][0], rows)
            conn.commit()
            pending.clear()
            n_pending = 0

        while seen < end:
            for msg in consumer.consume(5000, 1.0):
                if msg.error():
                    continue
                seen += 1
                ev = orjson.loads(msg.value())
                if ev["op"] in ("insert", "update", "read"):
                    _sql_text, names = stmts[ev["table"]]
                    pending.setdefault(ev["table"], []).append(tuple(ev["new"][n] for n in names))
                    n_pending += 1
                    if n_pending >= 1000:
                        flush()
                if seen == snapshot_end:
                    flush()
                    snap_s, snap_cpu = time.monotonic() - t0, time.process_time() - c0
                    snap_busy = machine_busy_s()
        flush()
    busy = machine_busy_s() - snap_busy
    consumer.close()
    return {"snapshot_s": snap_s, "total_s": time.monotonic() - t0, "snapshot_cpu_s": snap_cpu,
            "cpu_s": time.process_time() - c0, "changes_machine_cpu_s": busy}  # fmt: skip


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (every core; /proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run_copy(target: Target, rows: int) -> dict[str, Any]:
    with psycopg.connect(target.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE pgbench_accounts (aid integer PRIMARY KEY, bid integer,"
                  " abalance integer, filler character(84))")  # fmt: skip
        backend = c.info.backend_pid
        t0, s0 = time.monotonic(), proc_stats(backend)[0]
        with c.cursor() as cur, cur.copy("COPY pgbench_accounts FROM STDIN") as cp:
            for a in range(1, rows + 1):
                cp.write_row((a, (a - 1) // 100_000 + 1, 0, FILLER))
        return {"rows_s": rows / (time.monotonic() - t0),
                "server_cpu_us_per_row": (proc_stats(backend)[0] - s0) / rows * 1e6}  # fmt: skip


def run_consume(
    bootstrap: str, topic: str, records: int, config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The topic's first ``records`` read by a bare confluent-kafka loop (``consume`` and
    ``value()``, nothing else): what any consumer of the topic pays per record, its own
    CPU and the broker's (the machine's busy time, every process). ``config``: the
    consumer's fetch settings (default: walcast's refetch wait)."""
    if config is None:
        config = {"fetch.queue.backoff.ms": FETCH_BACKOFF_MS}
    consumer = Consumer({"bootstrap.servers": bootstrap,
                         "group.id": f"{topic}-bare-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, **config})  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    t0, m0 = time.monotonic(), machine_busy_s()
    while seen < records:
        for msg in consumer.consume(10_000, 1.0):
            msg.value()
            seen += 1
    wall, busy = time.monotonic() - t0, machine_busy_s() - m0
    consumer.close()
    return {"records_s": seen / wall, "machine_cpu_us_per_record": busy / seen * 1e6}


def run_copy_versioned(target: Target, rows: int) -> dict[str, Any]:
    """The raw COPY of the rows plus, in the same transaction, a COPY of one version per
    row into kafka2postgres's own bookkeeping (made by its migrations): the server's work
    for any snapshot that records each row's version — what the version guard and the
    tombstones need — with no client work beyond sending pre-made text."""
    from shared.migrations import migrate

    with psycopg.connect(target.dsn, autocommit=True) as c:
        migrate(c, "kafka2postgres")
        c.execute("CREATE TABLE pgbench_accounts (aid integer PRIMARY KEY, bid integer,"
                  " abalance integer, filler character(84))")  # fmt: skip
        backend = c.info.backend_pid
        t0, s0 = time.monotonic(), proc_stats(backend)[0]
        with c.transaction(), c.cursor() as cur:
            with cur.copy("COPY pgbench_accounts FROM STDIN") as cp:
                for a in range(1, rows + 1):
                    cp.write_row((a, (a - 1) // 100_000 + 1, 0, FILLER))
            with cur.copy('COPY "_walcast_target"."rows" (tbl, key, version, deleted, hash, xid)'
                          " FROM STDIN") as cp:  # fmt: skip
                for a in range(1, rows + 1):
                    cp.write_row((1, f"({a})", 1000, False, a * 7919, 0))
        return {"rows_s": rows / (time.monotonic() - t0),
                "server_cpu_us_per_row": (proc_stats(backend)[0] - s0) / rows * 1e6}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--snapshot-rows", type=int, default=10_000_000)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--json", type=Path, default=RESULTS / "kafka2postgres.json")
    args = ap.parse_args(argv)
    env = read_env()
    bootstrap = env["WALCAST_KAFKA_BOOTSTRAP"]
    topic = f"k2p-bench-{os.getpid()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    out: dict[str, Any] = {"snapshot_rows": args.snapshot_rows, "events": args.events}
    try:
        print(f"filling {topic}: {args.snapshot_rows:,} snapshot rows, {args.events:,} changes")
        expected: dict[str, tuple[int, int]] = {}
        snapshot_end = fill_topic(
            bootstrap, topic, "public", args.snapshot_rows, args.events, expected
        )
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "k2p-bench-end"})
        end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        c.close()
        changes = end - snapshot_end
        for label, fn in (
            ("copy", lambda t: run_copy(t, args.snapshot_rows)),
            ("copy_versioned", lambda t: run_copy_versioned(t, args.snapshot_rows)),
            ("consume", lambda t: run_consume(bootstrap, topic, snapshot_end)),
            ("kafka2postgres",
             lambda t: run_kafka2postgres(env, bootstrap, topic, t, snapshot_end, end)),
            ("minimal", lambda t: run_minimal(bootstrap, topic, t, snapshot_end, end)),
        ):  # fmt: skip
            t = Target(env["WALCAST_PG_DSN"], label)
            try:
                print(f"running {label}...", flush=True)
                out[label] = fn(t)
                if label in ("kafka2postgres", "minimal"):
                    # an applier that lost or misplaced rows measured nothing
                    got = target_state(t.dsn)
                    if got != expected:
                        raise SystemExit(f"{label}: the target is not what the topic says:"
                                         f" {got} != {expected} (rows, balance total)")  # fmt: skip
            finally:
                t.drop()
        for label in ("kafka2postgres", "minimal"):
            r = out[label]
            r["snapshot_rows_s"] = args.snapshot_rows / r["snapshot_s"]
            r["events_s"] = changes / (r["total_s"] - r["snapshot_s"])
            r["cpu_us_per_event"] = (r["cpu_s"] - r["snapshot_cpu_s"]) / changes * 1e6
            r["machine_cpu_us_per_event"] = r["changes_machine_cpu_s"] / changes * 1e6
        k, m = out["kafka2postgres"], out["minimal"]
        out["ratios"] = {
            "events_kafka2postgres_over_minimal": k["events_s"] / m["events_s"],
            "snapshot_kafka2postgres_over_copy": k["snapshot_rows_s"] / out["copy"]["rows_s"],
            "copy_versioned_over_copy": out["copy_versioned"]["rows_s"] / out["copy"]["rows_s"],
        }
        # The most any snapshot that keeps a version per row and reads the topic through
        # confluent-kafka can reach on this machine: the cores, divided by the server's
        # CPU per row for the rows and their versions plus a bare read's per record (the
        # consumer's and the broker's), nothing left for decoding, checking or encoding.
        per_row = (out["copy_versioned"]["server_cpu_us_per_row"]
                   + out["consume"]["machine_cpu_us_per_record"])  # fmt: skip
        out["ceiling"] = {"cores": os.cpu_count(), "cpu_us_per_row": per_row,
                        "rows_s": (os.cpu_count() or 1) / per_row * 1e6}  # fmt: skip
        out["ratios"]["ceiling_over_copy"] = out["ceiling"]["rows_s"] / out["copy"]["rows_s"]
    finally:
        admin.delete_topics([topic, f"{topic}.dlq"])
    print()
    print(f"{'':16} {'snapshot rows/s':>16} {'TPC-B events/s':>15} {'CPU µs/event':>13}"
          f" {'peak RSS MB':>12} {'machine µs/event':>17}")  # fmt: skip
    for label in ("copy", "copy_versioned"):
        r = out[label]
        cpu = r["server_cpu_us_per_row"]
        print(f"{label:16} {r['rows_s']:>16,.0f}   (server CPU {cpu:.2f} µs/row)")
    r = out["consume"]
    print(f"{'bare consume':16} {r['records_s']:>16,.0f}"
          f"   (machine CPU {r['machine_cpu_us_per_record']:.2f} µs/record)")  # fmt: skip
    for label in ("kafka2postgres", "minimal"):
        r = out[label]
        rss = f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else "-"
        print(f"{label:16} {r['snapshot_rows_s']:>16,.0f} {r['events_s']:>15,.0f}"
              f" {r['cpu_us_per_event']:>13.1f} {rss:>12}"
              f" {r['machine_cpu_us_per_event']:>17.1f}")  # fmt: skip
    ratios = out["ratios"]
    print(
        f"kafka2postgres / minimal (events/s): {ratios['events_kafka2postgres_over_minimal']:.2f}"
    )
    print(f"snapshot / COPY (rows/s): {out['ratios']['snapshot_kafka2postgres_over_copy']:.2f}")
    print(
        "COPY with each row's version / COPY (rows/s, the server's floor):"
        f" {ratios['copy_versioned_over_copy']:.2f}"
    )
    f = out["ceiling"]
    print(f"ceiling of a versioned snapshot read from Kafka on {f['cores']} cores:"
          f" {f['rows_s']:,.0f} rows/s ({f['cpu_us_per_row']:.2f} µs CPU/row),"
          f" {ratios['ceiling_over_copy']:.2f} of COPY")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
