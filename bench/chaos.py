"""The chaos suite: a real workload through the whole pipeline while faults hit it, then
every sink compared with Postgres — independently of walcast's code (plain SQL, plain
HTTP, the ``deltalake`` reader, a plain Kafka consumer).

Workload: pgbench's tables created *after* pg2kafka started (``pgbench -i -I dtpg``:
keys before data — the default order, data before keys, needs issue 17's snapshot when a
table gains its key), then TPC-B with ``--clients`` clients for ``--duration`` seconds
(longer when the fault plan needs it: the load runs until every planned fault was injected),
under ``producer.partition_key: primary_key`` (truncates and DDL on every partition).
Services as processes: pg2kafka, kafka2search into OpenSearch and into Elasticsearch,
kafka2spark.

Faults, at random moments during the load (``--seed``): kill -9 of each service (then
restarted), Kafka restarted, the search engine stopped (SIGSTOP) for ``--engine-stop-s``,
Postgres restarted. pgbench reconnects after a Postgres restart.

Afterwards: per table, rows compared key by key (every column) between Postgres, each
index and the Delta mirror; per key, the events of the CDC topic in partition order have
non-decreasing LSNs (exact redeliveries, same ``(commit_lsn, seq)``, left out: delivery is
at least once). Reported: faults injected, events, mismatches (must be 0), time to
converge after the load stopped, pgbench tps without and with the pipeline, and where
kafka2spark's time went (its batch log: time per phase, batch sizes, restart to first batch).

    python bench/chaos.py                      # the long form: 20 kills of each service
    python bench/chaos.py --kills 2 --duration 90 --engine-stop-s 20   # what CI runs

Needs the local stack (``deploy/local/walcast up``). Writes a table and
``bench/results/chaos.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from deltalake import DeltaTable

REPO = Path(__file__).resolve().parents[1]
WALCAST = REPO / "deploy/local/walcast"
KEYS = {"pgbench_branches": "bid", "pgbench_tellers": "tid", "pgbench_accounts": "aid"}
START_MARK = "=== chaos: started at"
LOAD_RUN_S = 10  # one pgbench run of the load; the load stops between runs (so a stop
# waits 5 s on average, not a long run's half)
SERVICES = ("pg2kafka", "kafka2search-opensearch", "kafka2search-elasticsearch", "kafka2spark")
_SINK_SERVICES = {
    "opensearch": "kafka2search-opensearch",
    "elasticsearch": "kafka2search-elasticsearch",
    "delta": "kafka2spark",
}


def stack_env() -> dict[str, str]:
    path = Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack")) / "walcast.env"
    env = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            env[key] = value
    return env


@dataclass
class Config:
    name: str
    scale: int = 1
    clients: int = 4
    # TPC-B transactions per second, all clients together (pgbench --rate); None: as fast
    # as they go. The short form in tests caps it: the faults and their order are what it
    # checks, and every event more is time the Delta mirror spends catching up.
    rate: int | None = None
    duration_s: float = 600.0
    kills: int = 20  # per service
    kafka_restarts: int = 2
    engine_stops: int = 2
    engine_stop_s: float = 60.0
    postgres_restarts: int = 2
    seed: int = 1
    converge_timeout_s: float = 900.0  # without progress
    # run each sink's `verify` over and over during the load, and once after convergence
    # (issue 39: no false alarm on a moving source under faults)
    verify: bool = False
    # ...and the load goes on past --duration, faults over, until one of those finished
    # whole (a fault in its way ends it early), this long at most
    verify_wait_s: float = 300.0
    # TPC-B alone first (the report's "tps without"): the short form in tests skips it
    baseline: bool = True
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="walcast-chaos-")))


@dataclass
class Report:
    faults: dict[str, int] = field(default_factory=dict)
    fault_log: list[tuple[float, str]] = field(default_factory=list)
    events: int = 0
    mismatches: dict[str, dict[str, int]] = field(default_factory=dict)
    lsn_order_violations: int = 0
    converge_s: float | None = None
    tps_without: float = 0.0
    tps_with: float = 0.0
    load_s: float = 0.0
    kafka2spark: dict[str, Any] = field(default_factory=dict)
    # each verification: sink, during the load or after, ok / differences / error
    verifications: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_mismatches(self) -> int:
        return sum(sum(v.values()) for v in self.mismatches.values()) + self.lsn_order_violations


class Service:
    """One service process, restartable after a kill -9."""

    def __init__(self, name: str, module: str, env: dict[str, str], cfg: Config) -> None:
        self.name, self.module, self.env, self.cfg = name, module, env, cfg
        self.log = cfg.work / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        out.write(f"{START_MARK} {time.time():.3f}\n".encode())  # for spark_timings()
        out.flush()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                f"services.{self.module}",
                "--env-file",
                str(Path(stack_env()["WALCAST_STACK_DIR"]) / "walcast.env"),
                "run",
            ],
            env={**os.environ, **self.env},
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.kill9()

    def died(self) -> bool:
        """Exited by itself (not killed by us): a defect to report."""
        return self.proc is not None and self.proc.poll() not in (None, -9)


class Chaos:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.env = stack_env()
        self.dsn = self.env["WALCAST_PG_DSN"]
        self.schema = cfg.name
        self.topic = f"{cfg.name}.cdc"
        self.delta = cfg.work / "delta"
        self.report = Report()
        self.rng = random.Random(cfg.seed)  # noqa: S311 - fault timing, not secrets
        self.services: dict[str, Service] = {}
        self.keys: dict[str, str] = dict(KEYS)  # the tables compared, and their key column
        self.pgbench = (
            shutil.which("pgbench") or sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))[-1]
        )
        self.started = time.monotonic()

    # -- set-up --------------------------------------------------------------------------

    def envs(self) -> dict[str, dict[str, str]]:
        name, topic = self.cfg.name.replace("_", "-"), self.topic
        common = {"HTTP__PORT": "0", "LOG__FORMAT": "text"}
        search = {
            "CONSUMER__TOPICS": json.dumps([topic]),
            "INDEX__NAME_TEMPLATE": f"{name}-{{table}}",
            "CONSUMER__SESSION_TIMEOUT_MS": "6000",
        }
        out: dict[str, dict[str, str]] = {
            "pg2kafka": {
                "REPLICATION__SLOT": self.cfg.name,
                "REPLICATION__PUBLICATION": self.cfg.name,
                "PRODUCER__TOPIC": topic,
                "PRODUCER__CREATE_TOPIC": "true",
                "PRODUCER__PARTITION_KEY": "primary_key",
                "PRODUCER__TOPIC_PARTITIONS": "6",
                "FILTERS__INCLUDE": json.dumps([f"{self.schema}.*"]),
            },
            "kafka2spark": {
                "SOURCE__TOPICS": json.dumps([topic]),
                "SOURCE__GROUP_ID": f"{name}-spark",
                "DELTA__ROOT": str(self.delta),
                "TRIGGER__INTERVAL_S": "2",
            },
        }
        for kind in ("opensearch", "elasticsearch"):
            out[f"kafka2search-{kind}"] = {
                **search,
                "CONSUMER__GROUP_ID": f"{name}-{kind}",
                "CONSUMER__DLQ_TOPIC": f"{name}.{kind}.dlq",
                "ENGINE__KIND": kind,
                "ENGINE__URLS": json.dumps([self.url(kind)]),
                "INDEX__NAME_TEMPLATE": f"{name}-{kind}-{{table}}",
            }
        prefixes = {"pg2kafka": "PG2KAFKA_", "kafka2spark": "KAFKA2SPARK_"}
        return {
            svc: {prefixes.get(svc, "KAFKA2SEARCH_") + k: v for k, v in {**common, **e}.items()}
            for svc, e in out.items()
        }

    def url(self, kind: str) -> str:
        return self.env[
            "WALCAST_OPENSEARCH_URL" if kind == "opensearch" else "WALCAST_ELASTICSEARCH_URL"
        ]

    def sql(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            cur = c.execute(statement)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def bench(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PGOPTIONS": f"-c search_path={self.schema}"}
        done = subprocess.run(
            [self.pgbench, *args, self.dsn],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"pgbench {' '.join(args)}: {done.stderr[-2000:]}")
        return done

    def stack(self, *args: str) -> None:
        done = subprocess.run(
            [str(WALCAST), *args], capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"walcast {' '.join(args)}: {done.stderr[-2000:]}")

    def setup(self) -> None:
        self.sql(f"CREATE SCHEMA {self.schema}")
        if self.cfg.baseline:
            # tps without the pipeline: the same TPC-B on the same tables, before pg2kafka
            self.bench("-i", "-I", "dtpg", "-s", str(self.cfg.scale))
            seconds = max(10, min(60, int(self.cfg.duration_s // 3)))
            self.report.tps_without = self.tps(
                self.bench("-n", "-c", str(self.cfg.clients), "-j", "2", "-T", str(seconds))
            )
            self.sql(f"DROP SCHEMA {self.schema} CASCADE")
            self.sql(f"CREATE SCHEMA {self.schema}")
        envs = self.envs()
        pg = Service("pg2kafka", "pg2kafka", envs["pg2kafka"], self.cfg)
        init = subprocess.run(
            [
                sys.executable,
                "-m",
                "services.pg2kafka",
                "--env-file",
                str(Path(self.env["WALCAST_STACK_DIR"]) / "walcast.env"),
                "init",
            ],
            env={**os.environ, **envs["pg2kafka"]},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if init.returncode != 0:
            raise RuntimeError(f"pg2kafka init: {init.stderr[-2000:]}")
        self.services["pg2kafka"] = pg
        for svc in SERVICES[1:]:
            module = "kafka2spark" if svc == "kafka2spark" else "kafka2search"
            self.services[svc] = Service(svc, module, envs[svc], self.cfg)
        for s in self.services.values():
            s.start()
        # the tables are created after pg2kafka started
        time.sleep(3)
        self.bench("-i", "-I", "dtpg", "-s", str(self.cfg.scale))

    @staticmethod
    def tps(done: subprocess.CompletedProcess[str]) -> float:
        for line in done.stdout.splitlines():
            if line.startswith("tps ="):
                return float(line.split()[2])
        return 0.0

    # -- load and faults -----------------------------------------------------------------

    def load(self, stop: threading.Event, done_tx: list[int]) -> None:
        """TPC-B until ``stop``, in runs of at most :data:`LOAD_RUN_S`; restarted after a
        Postgres restart cut a run short."""
        while not stop.is_set():
            rate = ["-R", str(self.cfg.rate)] if self.cfg.rate else []
            out = self.bench(
                "-n",
                "-c",
                str(self.cfg.clients),
                "-j",
                "2",
                "-T",
                str(LOAD_RUN_S),
                *rate,
                check=False,
            )
            for line in out.stdout.splitlines():
                if line.startswith("number of transactions actually processed"):
                    done_tx.append(int(line.split(":")[1].split("/")[0].strip()))
            if out.returncode != 0:
                time.sleep(2)  # Postgres is restarting

    def faults(self) -> list[tuple[str, Callable[[], None]]]:
        plan: list[tuple[str, Callable[[], None]]] = []
        for svc in SERVICES:
            plan += [(f"kill -9 {svc}", lambda s=svc: self.kill(s))] * self.cfg.kills
        plan += [("restart kafka", self.restart_kafka)] * self.cfg.kafka_restarts
        plan += [("stop opensearch", self.stop_engine)] * self.cfg.engine_stops
        plan += [("restart postgres", self.restart_postgres)] * self.cfg.postgres_restarts
        self.rng.shuffle(plan)
        return plan

    def kill(self, svc: str) -> None:
        s = self.services[svc]
        s.kill9()
        time.sleep(self.rng.uniform(0.5, 3))
        s.start()

    def restart_kafka(self) -> None:
        self.stack("down", "kafka")
        time.sleep(self.rng.uniform(2, 8))
        self.stack("up")

    def restart_postgres(self) -> None:
        self.stack("down", "postgres")
        time.sleep(self.rng.uniform(1, 4))
        self.stack("up")

    def stop_engine(self, kind: str = "opensearch") -> None:
        """Freeze the search engine (SIGSTOP) for ``engine_stop_s``, then let it go on.
        (The local stack's engines start empty: a real restart would lose the index.)"""
        status = subprocess.run(
            [str(WALCAST), "status", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        pid = next(
            int(c["pid"]) for c in json.loads(status.stdout)["components"] if c["name"] == kind
        )
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(self.cfg.engine_stop_s)
        finally:
            os.kill(pid, signal.SIGCONT)

    def run_load_with_faults(self) -> None:
        stop = threading.Event()
        done_tx: list[int] = []
        loader = threading.Thread(target=self.load, args=(stop, done_tx), daemon=True)
        started = time.monotonic()
        loader.start()
        verifier = None
        if self.cfg.verify:
            verifier = threading.Thread(target=self.verify_loop, args=(stop,), daemon=True)
            verifier.start()
        plan = self.faults()
        gap = self.cfg.duration_s / (len(plan) + 1)
        for what, fault in plan:
            time.sleep(self.rng.uniform(0.3, 1.7) * gap)
            if not loader.is_alive():
                raise RuntimeError(f"the load stopped by itself: see {self.cfg.work}")
            self.report.fault_log.append((round(time.monotonic() - started, 1), what))
            self.report.faults[what] = self.report.faults.get(what, 0) + 1
            fault()
            dead = [s.name for s in self.services.values() if s.died()]
            if dead:
                raise RuntimeError(f"{dead} exited by itself: see {self.cfg.work}")
        # Every planned fault happened during the load; the load lasts --duration at least.
        time.sleep(max(0.0, started + self.cfg.duration_s - time.monotonic()))
        if verifier is not None:
            self.wait_for_a_verification_under_load(loader)
        stop.set()
        loader.join()
        if verifier is not None:
            verifier.join(600)
        self.report.load_s = round(time.monotonic() - started, 1)
        self.report.tps_with = sum(done_tx) / max(self.report.load_s, 1e-6)

    # -- verify (walcast's own comparison, issue 39) -------------------------------------

    def verify_once(self, sink: str, phase: str) -> dict[str, Any]:
        """One ``verify`` of pgbench's tables by ``sink``'s service, as a process."""
        svc = _SINK_SERVICES[sink]
        module, prefix = ("kafka2spark", "KAFKA2SPARK_") if sink == "delta" else (
            "kafka2search", "KAFKA2SEARCH_")  # fmt: skip
        env = {**os.environ, **self.envs()[svc]}
        for k, v in {
            "POSTGRES__HOST": self.env["PG2KAFKA_POSTGRES__HOST"],
            "POSTGRES__PORT": self.env["PG2KAFKA_POSTGRES__PORT"],
            "POSTGRES__DATABASE": self.env["PG2KAFKA_POSTGRES__DATABASE"],
            "POSTGRES__USER": self.env["PG2KAFKA_POSTGRES__USER"],
            "POSTGRES__PASSWORD": self.env["PG2KAFKA_POSTGRES__PASSWORD"],
            "SLOT": self.cfg.name, "MARK_TIMEOUT_S": "60", "RANGE_ROWS": "5000",
        }.items():  # fmt: skip
            env[f"{prefix}VERIFY__{k}"] = v
        tables = [a for t in self.keys for a in ("--table", f"{self.schema}.{t}")]
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", f"services.{module}", "--env-file",
             str(Path(self.env["WALCAST_STACK_DIR"]) / "walcast.env"), "verify", *tables,
             "--json"],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        out: dict[str, Any] = {"sink": sink, "phase": phase,
                               "s": round(time.monotonic() - started, 1)}  # fmt: skip
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
            out["error"] = lines[-1][:300]
            return out
        out["ok"] = report["ok"]
        kinds = ("missing", "extra", "differs", "unknown")
        out["differences"] = {
            t["table"]: {k: t[k] for k in kinds if t[k]["count"]}
            for t in report["tables"] if not t["ok"]
        }  # fmt: skip
        out["changing"] = sum(t["changing"]["count"] for t in report["tables"])
        return out

    def wait_for_a_verification_under_load(self, loader: threading.Thread) -> None:
        """Every fault may have cut the verifications so far short (a Postgres restart
        ends them all): the load goes on until one finished, whatever it found."""
        deadline = time.monotonic() + self.cfg.verify_wait_s
        while time.monotonic() < deadline and loader.is_alive():
            if any("error" not in v for v in self.report.verifications):
                return
            time.sleep(1)
        print(
            f"chaos: no verification finished during the load, {self.cfg.verify_wait_s:.0f} s"
            f" past --duration: {self.report.verifications}",
            file=sys.stderr,
        )

    def verify_loop(self, stop: threading.Event) -> None:
        """Each sink's verifications one after another, the sinks side by side: one
        verification waiting out a fault (kafka2spark's first batch after its kill) holds
        up no other sink's."""
        sinks = [s for s, svc in _SINK_SERVICES.items() if svc in self.services]

        def loop(sink: str) -> None:
            while not stop.is_set():
                self.report.verifications.append(self.verify_once(sink, "load"))

        threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in sinks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -- comparison (no walcast code) ----------------------------------------------------

    def pg_rows(self, table: str) -> dict[str, Any]:
        key = self.keys[table]
        return {
            str(k): v
            for k, v in self.sql(f"SELECT {key}, to_jsonb(x) FROM {self.schema}.{table} x")
        }

    def http(self, base: str, path: str, body: Any = None, method: str | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        method = method or ("POST" if data else "GET")
        req = urllib.request.Request(base + path, data=data, method=method)  # noqa: S310
        req.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def index_rows(self, kind: str, table: str) -> dict[str, Any]:
        base = self.url(kind)
        alias = f"{self.cfg.name.replace('_', '-')}-{kind}-{table}"
        # No body: Elasticsearch 8 refuses one on _refresh.
        if self.http(base, f"/{alias}/_refresh", method="POST") is None:
            return {}
        out: dict[str, Any] = {}
        page = self.http(
            base,
            f"/{alias}/_search?scroll=2m",
            {
                "size": 5000,
                "sort": ["_doc"],
                "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]},
            },
        )
        while page["hits"]["hits"]:
            out.update({h["_id"]: h["_source"] for h in page["hits"]["hits"]})
            page = self.http(
                base, "/_search/scroll", {"scroll": "2m", "scroll_id": page["_scroll_id"]}
            )
        return out

    def delta_rows(self, table: str) -> dict[str, Any]:
        path = self.delta / f"{self.schema}.{table}"
        if not any((path / "_delta_log").glob("*.json")):  # not created yet, or being created
            return {}
        rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        key = self.keys[table]
        return {str(r[key]): {k: v for k, v in r.items() if not k.startswith("_walcast_")}
               for r in rows}  # fmt: skip

    def sinks(self) -> dict[str, Callable[[str], dict[str, Any]]]:
        return {
            "opensearch": lambda t: self.index_rows("opensearch", t),
            "elasticsearch": lambda t: self.index_rows("elasticsearch", t),
            "delta": self.delta_rows,
        }

    def differences(self) -> dict[str, dict[str, int]]:
        want = {t: self.pg_rows(t) for t in self.keys}
        out: dict[str, dict[str, int]] = {}
        for sink, read in self.sinks().items():
            for t in self.keys:
                got = read(t)
                missing = len(set(want[t]) - set(got))
                extra = len(set(got) - set(want[t]))
                differ = sum(1 for k, v in want[t].items() if k in got and got[k] != v)
                if missing or extra or differ:
                    out[f"{sink}:{t}"] = {"missing": missing, "extra": extra, "differ": differ}
        return out

    def converge(self) -> None:
        """Wait until every sink equals Postgres; give up after ``converge_timeout_s``
        without the number of differences going down."""
        stopped = time.monotonic()
        best, last_progress = None, time.monotonic()
        while True:
            looked = time.monotonic()
            diff = self.differences()
            looked = time.monotonic() - looked
            n = sum(sum(v.values()) for v in diff.values())
            if n == 0:
                self.report.converge_s = round(time.monotonic() - stopped, 1)
                self.report.mismatches = {}
                return
            if best is None or n < best:
                best, last_progress = n, time.monotonic()
            dead = [s.name for s in self.services.values() if s.died()]
            if dead or time.monotonic() - last_progress > self.cfg.converge_timeout_s:
                self.report.mismatches = diff
                return
            time.sleep(max(5.0, looked))  # a look reads every sink whole: not half the time

    def lsn_order(self) -> None:
        """Per key, in partition order, LSNs never go down (exact redeliveries aside)."""
        conf = {
            "bootstrap.servers": self.env["WALCAST_KAFKA_BOOTSTRAP"],
            "group.id": f"{self.cfg.name}-verify",
            "enable.auto.commit": False,
        }
        c = Consumer(conf)
        md = c.list_topics(self.topic, timeout=10).topics[self.topic]
        parts = [TopicPartition(self.topic, p, 0) for p in md.partitions]
        ends = {p.partition: c.get_watermark_offsets(p, timeout=10)[1] for p in parts}
        c.assign(parts)
        seen: set[tuple[int, int, int]] = set()
        last: dict[tuple[int, str], tuple[int, int]] = {}
        done = {p: ends[p] == 0 for p in ends}
        events = 0
        try:
            while not all(done.values()):
                msg = c.poll(1.0)
                if msg is None or msg.error():
                    continue
                if msg.offset() >= ends[msg.partition()] - 1:
                    done[msg.partition()] = True
                ev = json.loads(msg.value())
                events += 1
                if ev.get("op") not in ("insert", "update", "delete") or ev.get("append_only"):
                    continue  # append-only rows have no key: no per-key order to check
                epoch = ev.get("epoch", 0)  # a new source's changes order after the old's
                pos = (epoch, ev["commit_lsn"], ev["seq"])
                if pos in seen:
                    continue  # an exact redelivery
                seen.add(pos)
                k = (msg.partition(), f"{ev['table']}:{json.dumps(ev.get('key'), sort_keys=True)}")
                version = (epoch, ev["lsn"])
                if version < last.get(k, (-1, -1)):
                    self.report.lsn_order_violations += 1
                last[k] = max(version, last.get(k, (-1, -1)))
        finally:
            c.close()
        self.report.events = events

    # -- the run -------------------------------------------------------------------------

    def run(self) -> Report:
        try:
            self.setup()
            self.run_load_with_faults()
            self.converge()
            if self.cfg.verify:  # the sinks equal Postgres now: every verify must say so
                with ThreadPoolExecutor(3) as pool:
                    self.report.verifications.extend(pool.map(
                        lambda sink: self.verify_once(sink, "after"),
                        ("opensearch", "elasticsearch", "delta"),
                    ))  # fmt: skip
            self.lsn_order()
        finally:
            for s in self.services.values():
                s.stop()
        if "kafka2spark" in self.services:
            self.report.kafka2spark = spark_timings(self.services["kafka2spark"].log)
        return self.report

    def cleanup(self) -> None:
        name = self.cfg.name.replace("_", "-")
        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")  # type: ignore[arg-type]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "services.pg2kafka",
                "--env-file",
                str(Path(self.env["WALCAST_STACK_DIR"]) / "walcast.env"),
                "tear-down",
            ],
            env={**os.environ, **self.envs()["pg2kafka"]},
            cwd=REPO,
            capture_output=True,
            timeout=300,
            check=False,
        )
        for kind in ("opensearch", "elasticsearch"):
            for t in self.keys:
                indices = self.http(self.url(kind), f"/_alias/{name}-{kind}-{t}") or {}
                for index in indices:
                    req = urllib.request.Request(f"{self.url(kind)}/{index}", method="DELETE")  # noqa: S310
                    urllib.request.urlopen(req, timeout=60).close()  # noqa: S310
        admin = AdminClient({"bootstrap.servers": self.env["WALCAST_KAFKA_BOOTSTRAP"]})
        topics = [
            t
            for t in admin.list_topics(timeout=10).topics
            if t.startswith(name) or t.startswith(self.cfg.name)
        ]
        for fut in admin.delete_topics(topics).values() if topics else []:
            fut.result(60)
        shutil.rmtree(self.cfg.work, ignore_errors=True)


_BATCH = re.compile(r"^(\S+ \S+) .*\bbatch \d+: (\d+) records, .* in ([\d.]+)s \((.*)\)$")


def spark_timings(log: Path) -> dict[str, Any]:
    """Where kafka2spark's time went, from its own batch log lines: the batches, their
    sizes and seconds, the seconds per phase (read, changelog, plan, table merges, commit),
    and from each (re)start to its first finished batch (JVM, Spark session, Delta's log,
    then the batch Spark redoes)."""
    batches: list[tuple[int, float]] = []
    phases: dict[str, float] = {}
    to_first: list[float] = []
    started: float | None = None
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(START_MARK):
            started = float(line.split()[-1])
            continue
        m = _BATCH.match(line)
        if not m:
            continue
        when, records, seconds, breakdown = m.groups()
        batches.append((int(records), float(seconds)))
        for part in breakdown.split(", "):
            name, _, took = part.rpartition(" ")
            kind = name.split(" ")[0]
            phases[kind] = phases.get(kind, 0.0) + float(took.rstrip("s") or 0)
        if started is not None:
            at = time.mktime(time.strptime(when.split(",")[0], "%Y-%m-%d %H:%M:%S"))
            to_first.append(round(at - started, 1))
            started = None
    if not batches:
        return {}
    secs = sorted(b for _, b in batches)
    total = sum(secs)
    return {
        "batches": len(batches),
        "records": sum(r for r, _ in batches),
        "max_records": max(r for r, _ in batches),
        "batch_s_median": secs[len(secs) // 2],
        "batch_s_max": secs[-1],
        "batch_s_total": round(total, 1),
        "phase_share": {k: round(v / total, 3) for k, v in sorted(phases.items())} if total else {},
        "start_to_first_batch_s": sorted(to_first),
    }


def print_report(cfg: Config, r: Report) -> None:
    rows = [
        ("faults injected", ", ".join(f"{k} x{v}" for k, v in sorted(r.faults.items()))),
        ("change events in the topic", f"{r.events:,}"),
        ("mismatches (rows, all sinks)", str(sum(sum(v.values()) for v in r.mismatches.values()))),
        ("per-key LSN order violations", str(r.lsn_order_violations)),
        (
            "converged after the load stopped",
            f"{r.converge_s} s" if r.converge_s is not None else "no (see mismatches)",
        ),
        (
            "pgbench tps without / with the pipeline",
            f"{r.tps_without:.0f} / {r.tps_with:.0f}" if r.tps_without else f"- / {r.tps_with:.0f}",
        ),
        ("load (TPC-B) ran", f"{r.load_s:.0f} s"),
    ]
    k = r.kafka2spark
    if k:
        first = k["start_to_first_batch_s"]
        rows += [
            (
                "kafka2spark batches",
                f"{k['batches']} ({k['records']:,} records, at most {k['max_records']:,});"
                f" median {k['batch_s_median']} s, max {k['batch_s_max']} s",
            ),
            (
                "kafka2spark time by phase",
                ", ".join(f"{p} {v:.0%}" for p, v in k["phase_share"].items()),
            ),
            (
                "kafka2spark start to first batch",
                f"median {first[len(first) // 2]} s, max {first[-1]} s ({len(first)} starts)"
                if first
                else "-",
            ),
        ]
    width = max(len(a) for a, _ in rows)
    rate = f" at most {cfg.rate} tps," if cfg.rate else ""
    print(f"chaos: scale {cfg.scale}, {cfg.clients} clients,{rate} TPC-B for {r.load_s:.0f} s")
    for a, b in rows:
        print(f"  {a:<{width}}  {b}")
    if r.verifications:
        done = [v for v in r.verifications if "error" not in v]
        false = [v for v in done if not v["ok"]]
        print(f"  verify: {len(done)} verifications ({len(false)} reporting a difference),"
              f" {len(r.verifications) - len(done)} not finished (a fault in the way)")  # fmt: skip
        for v in false:
            print(f"    {v['sink']} ({v['phase']}): {v['differences']}")
        for v in r.verifications:
            if "error" in v:
                print(f"    not finished: {v['sink']} ({v['phase']}, {v['s']} s): {v['error']}")
    if r.mismatches:
        print(f"  differences: {r.mismatches}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rate", type=int, default=None, help="TPC-B transactions/s (default: no cap)")
    p.add_argument("--duration", type=float, default=600)
    p.add_argument("--kills", type=int, default=20, help="kill -9 of each service")
    p.add_argument("--kafka-restarts", type=int, default=2)
    p.add_argument("--engine-stops", type=int, default=2)
    p.add_argument("--engine-stop-s", type=float, default=60)
    p.add_argument("--postgres-restarts", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--verify", action="store_true", help="each sink's verify during the load and after"
    )
    p.add_argument("--json", type=Path, default=REPO / "bench/results/chaos.json")
    args = p.parse_args(argv)
    cfg = Config(
        name=f"chaos_{os.getpid()}",
        scale=args.scale,
        clients=args.clients,
        rate=args.rate,
        duration_s=args.duration,
        kills=args.kills,
        kafka_restarts=args.kafka_restarts,
        engine_stops=args.engine_stops,
        engine_stop_s=args.engine_stop_s,
        postgres_restarts=args.postgres_restarts,
        seed=args.seed,
        verify=args.verify,
    )
    chaos = Chaos(cfg)
    try:
        report = chaos.run()
    finally:
        chaos.cleanup()
    print_report(cfg, report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {**report.__dict__, "config": {k: v for k, v in cfg.__dict__.items() if k != "work"}},
            indent=2,
            default=str,
        )
    )
    false = [v for v in report.verifications if "error" not in v and not v["ok"]]
    return 0 if report.total_mismatches == 0 and not false else 1


if __name__ == "__main__":
    sys.exit(main())
