"""pgbench where walcast's features meet, with one kill of each service (issue 37's
scenario): ``pgbench -i`` on an empty schema with pg2kafka running — in pgbench's
default order (``-I dtgvp``: tables filled, primary keys added afterwards, as
``pg_restore`` does, so each table is snapshotted incrementally when it gains its key)
or keys first (``-I dtpgv``: every row streamed as an insert) — then TPC-B, under a
partition key; ``pgbench_history`` has no key and streams insert-only by default.

Each service is killed once while the snapshot and TPC-B run: pg2kafka at a failpoint in
the middle of the incremental snapshot (``incremental.chunk_sent``: rows sent, not yet
acknowledged nor recorded) when there is one, else by SIGKILL a quarter into TPC-B;
kafka2search (OpenSearch), kafka2search (Elasticsearch) and kafka2spark by SIGKILL at
a quarter, half and three quarters of it. A supervisor restarts whatever died; a
service exiting by itself is a defect.

Then every sink is compared with Postgres row by row — OpenSearch, Elasticsearch and the
Delta mirror, ``pgbench_history`` included as a multiset (each row exactly once) — by the
composition suite's comparison (plain SQL, plain HTTP, ``deltalake``: no walcast code),
and the topic's per-key LSN order is checked.

    python bench/pgbench_kills.py                        # the four runs: both orders x
                                                         # primary_key and schema, scale 5
    python bench/pgbench_kills.py --order dtgvp --partition-key primary_key --scale 1

Needs the local stack; do not run it beside other tests of the same stack. Writes a
table and ``bench/results/pgbench_kills.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python bench/pgbench_kills.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.chaos import REPO, SERVICES, Config, Service
from bench.composition import Composition, RunReport, Scenario, print_run

ORDERS = ("dtgvp", "dtpgv")  # keys after the data (pgbench's default), keys first
PARTITION_KEYS = ("primary_key", "schema")
TABLES = {
    "pgbench_accounts": "aid",
    "pgbench_branches": "bid",
    "pgbench_tellers": "tid",
    "pgbench_history": "",  # no key: insert-only, compared as a multiset
}
SINK_KILLS = {"kafka2search-opensearch": 0.25, "kafka2search-elasticsearch": 0.5,
              "kafka2spark": 0.75}  # fmt: skip


class PgbenchKills(Composition):
    """One run: ``order`` under ``partition_key``, ``scale`` (100,000 accounts each),
    TPC-B for ``tpcb_s`` seconds with ``clients`` clients."""

    def __init__(
        self, cfg: Config, order: str, partition_key: str, scale: int, tpcb_s: float, clients: int
    ) -> None:
        snapshot = order.index("p") > order.index("g")  # keys after the data
        kills = {svc: "timed" for svc in SERVICES}
        if snapshot:
            # mid-snapshot: after a few chunks' rows were sent, before they are recorded
            kills["pg2kafka"] = "incremental.chunk_sent=exit@3"
        scenario = Scenario(
            seed=cfg.seed, partition_key=partition_key, tables={}, triggers=["automatic"],
            ddl=[], toast_table="", keyless=True, rows=scale * 100_000, load_s=tpcb_s,
            kills=kills, kafka_restart=False, engine_stop=None,
        )  # fmt: skip
        super().__init__(cfg, scenario)
        self.order, self.scale, self.clients = order, scale, clients
        self.keys = dict(TABLES)
        self.run_report.scenario = (
            f"pgbench -I {order} -s {scale}, TPC-B {tpcb_s:.0f} s x {clients} clients,"
            f" partition_key={partition_key}"
        )

    def envs(self) -> dict[str, dict[str, str]]:
        out = super().envs()
        pg = out["pg2kafka"]
        pg.pop("PG2KAFKA_FILTERS__KEYLESS_TABLES")  # the default: keyless tables insert-only
        pg["PG2KAFKA_SNAPSHOT__MODE"] = "never"  # the tables come after the slot
        pg["PG2KAFKA_SNAPSHOT__CHUNK_ROWS"] = "10000"
        return out

    def setup(self) -> None:
        self.sql(f"CREATE SCHEMA {self.schema}")
        envs = self.envs()
        self.cli(envs["pg2kafka"], "init")
        for svc in SERVICES:
            self.services[svc] = s = Service(svc, svc.split("-")[0], envs[svc], self.cfg)
            if self.sc.kills[svc] != "timed":
                s.env["WALCAST_FAILPOINTS"] = self.sc.kills[svc]
            s.start()

    def run_steps(self) -> None:
        self.bench("-i", "-q", "-I", self.order, "-s", str(self.scale))
        tpcb = threading.Thread(target=self.tpcb, daemon=True)
        started = time.monotonic()
        tpcb.start()
        plan = sorted(
            [(f * self.sc.load_s, svc) for svc, f in SINK_KILLS.items()]
            + ([(0.25 * self.sc.load_s, "pg2kafka")] if self.sc.kills["pg2kafka"] == "timed"
               else [])
        )  # fmt: skip
        for at, svc in plan:
            time.sleep(max(0.0, started + at - time.monotonic()))
            self.run_report.faults.append(f"kill {svc}")
            self.step("kill", svc)
        tpcb.join()

    def tpcb(self) -> None:
        done = self.bench(
            "-n", "-c", str(self.clients), "-j", "2", "-T", str(int(self.sc.load_s)), check=False
        )
        if done.returncode != 0:
            self.run_report.defects.append(f"pgbench TPC-B failed: {done.stderr[-600:]}")

    @staticmethod
    def clean(row: dict[str, Any]) -> dict[str, Any]:
        """As the composition suite's, with timestamps as Postgres writes them in JSON
        (Delta gives datetimes; ISO text without the fraction's trailing zeros)."""
        out = Composition.clean(row)
        for k, v in out.items():
            if hasattr(v, "isoformat"):
                text = v.isoformat()
                out[k] = text.rstrip("0").rstrip(".") if "." in text else text
        return out


def run_one(
    order: str,
    partition_key: str,
    scale: int,
    tpcb_s: float,
    clients: int,
    timeout_s: float,
    name: str = "",
) -> RunReport:
    """One run, cleaned up afterwards (schema, slot, topics, indices, Delta)."""
    name = name or f"pgbk_{order}_{partition_key[:2]}_{int(time.time()) % 100000}"
    cfg = Config(name=name, converge_timeout_s=timeout_s)
    run = PgbenchKills(cfg, order, partition_key, scale, tpcb_s, clients)
    try:
        return run.run_scenario()
    finally:
        run.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--order", choices=ORDERS, action="append", help="default: both")
    p.add_argument("--partition-key", choices=PARTITION_KEYS, action="append",
                   help="default: both")  # fmt: skip
    p.add_argument("--scale", type=int, default=5, help="pgbench scale (100,000 accounts each)")
    p.add_argument("--tpcb-s", type=float, default=60, help="seconds of TPC-B")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--timeout", type=float, default=300, help="seconds without progress")
    p.add_argument("--json", type=Path, default=REPO / "bench/results/pgbench_kills.json")
    args = p.parse_args(argv)
    runs: list[RunReport] = []
    for order in args.order or ORDERS:
        for key in args.partition_key or PARTITION_KEYS:
            print(f"=== pgbench -I {order}, partition_key={key}", flush=True)
            r = run_one(order, key, args.scale, args.tpcb_s, args.clients, args.timeout)
            runs.append(r)
            print_run(r)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps([asdict(x) for x in runs], indent=2, default=str))
    print(f"\n{'run':<58} {'events':>9} {'faults':>6} {'conv s':>7}  mismatches")
    for r in runs:
        conv = f"{r.converge_s}" if r.converge_s is not None else "-"
        mis = ", ".join(
            f"{k}:{sum(v for n, v in d.items() if n != 'examples')}"
            for k, d in r.mismatches.items()
        )
        print(f"{r.scenario[:58]:<58} {r.events:>9} {len(r.faults):>6} {conv:>7}  {mis or '0'}"
              + ("  DEFECT" if r.defects else ""))  # fmt: skip
    return 1 if any(r.failed for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
