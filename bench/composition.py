"""The composition suite: seeded random scenarios where walcast's features meet.

The chaos suite (bench/chaos.py) varies faults over one workload; defects live where
features meet (issue 37). Each scenario is drawn from one seed (:class:`Scenario`) and
combines load orders (keys before / after data, CREATE TABLE AS, dropped and re-created,
TRUNCATE + reload), a partition key, snapshot triggers (initial, signal-table row, CLI,
automatic on gaining a key), DDL during the load, a keyless insert-only table (compared
as a multiset; ``--no-keyless`` leaves it out), TOAST values, a SIGKILL of each service
(at a random moment or at a failpoint: mid-snapshot, mid-bulk, mid-micro-batch), a Kafka
restart and a frozen search engine (SIGSTOP: the local stack's engines start empty, so a
real restart would delete the index — which kafka2search refuses to write on, rightly).

Then, with the load stopped, it waits until both search engines, the Delta mirror and
kafka2postgres's target database equal Postgres row by row — by code that uses no walcast
module (plain SQL, plain HTTP, ``deltalake``; null and absent alike; the target database
read like the source, without kafka2postgres's row id column of the keyless table) — and
on timeout says which sink, table, how many
rows and which keys and columns differ. A service exiting by itself is a defect too.

    python bench/composition.py --runs 50      # the long form: 50 random seeds
    python bench/composition.py --seed 1234    # replay one scenario (--keep: keep it)

The seed is printed first; a failing run prints ``--seed N``. Replaying a seed replays
the scenario (tables, orders, DDL, triggers, faults and their moments), not the services'
own timing. Needs the local stack; restarts Kafka and freezes the engines, so do not run
it beside other tests of the same stack. Writes ``bench/results/composition.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from deltalake import DeltaTable

if __package__ in (None, ""):  # run as a script: python bench/composition.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.chaos import REPO, SERVICES, Chaos, Config, Service, spark_timings

LOAD_ORDERS = ("keys_first", "keys_after", "ctas", "drop_recreate", "truncate_reload")
PARTITION_KEYS = ("schema", "table", "primary_key")
TRIGGERS = ("initial", "signal", "cli", "automatic")
DDLS = ("add_column", "rename_column", "drop_column", "type_change")
KEYLESS = "events_log"  # the insert-only table
K2P = "kafka2postgres"  # drawn apart from SERVICES: the seeds' scenarios stay as they were
SINKS = ("opensearch", "elasticsearch", "delta", "postgres")
INITIAL = "preloaded"  # filled before the slot: the initial snapshot's table
FAILPOINT_EXIT = 86  # shared.failpoints.EXIT_CODE, restated (no walcast import here)
Rows = dict[str, dict[str, Any]] | Counter[str]  # by key; a keyless table's as a multiset
COLUMNS = "n int NOT NULL DEFAULT 0, note text, dropme text, small int, big text"


def big(expr: str, toast: bool) -> str:
    """A TOAST value (~4.8 kB of md5 hex: stored out of line) or NULL."""
    if not toast:
        return "NULL::text"
    return f"(SELECT string_agg(md5({expr}::text || i::text), '') FROM generate_series(1, 150) i)"


@dataclass
class Scenario:
    """One run's choices, all drawn from ``seed``: replaying the seed replays them."""

    seed: int
    partition_key: str
    tables: dict[str, str]  # table -> load order
    triggers: list[str]
    ddl: list[tuple[str, str]]  # (kind, table)
    toast_table: str
    keyless: bool
    rows: int
    load_s: float
    kills: dict[str, str]  # service -> "timed" or a failpoint spec
    kafka_restart: bool
    engine_stop: str | None  # the engine frozen (SIGSTOP) for a while
    timeline: list[tuple[float, str, str]] = field(default_factory=list)  # (at, what, arg)

    @classmethod
    def draw(cls, seed: int, rows: int, load_s: float, keyless: bool) -> Scenario:
        rng = random.Random(seed)  # noqa: S311 - scenarios, not secrets
        orders = rng.sample(LOAD_ORDERS, rng.randint(2, 4))
        tables = {order: order for order in orders}
        triggers = [t for t in ("initial", "signal", "cli") if rng.random() < 0.5]
        if {"keys_after", "ctas"} & set(orders):
            triggers.append("automatic")
        if not triggers:
            triggers.append(rng.choice(("initial", "signal", "cli")))
        if "initial" in triggers:
            tables[INITIAL] = "initial"
        keyed = sorted(tables)
        ddl = [(kind, rng.choice(keyed)) for kind in rng.sample(DDLS, rng.randint(1, 4))]
        incremental = bool({"signal", "cli", "automatic"} & set(triggers))
        kills: dict[str, str] = {}
        for svc in SERVICES:
            if rng.random() < 0.35:
                kills[svc] = "timed"
            elif svc == "pg2kafka":
                if incremental and ("initial" not in triggers or rng.random() < 0.5):
                    place = rng.choice(("chunk_read", "chunk_sent", "chunk_done"))
                    kills[svc] = f"incremental.{place}=exit@{rng.randint(1, 3)}"
                else:
                    place = rng.choice(("chunk_sent", "chunk_done"))
                    kills[svc] = f"snapshot.{place}=exit@{rng.randint(1, 2)}"
            elif svc == "kafka2spark":
                kills[svc] = f"kafka2spark.batch_written=exit@{rng.randint(1, 4)}"
            else:
                kills[svc] = f"consumer.batch_written=exit@{rng.randint(2, 12)}"
        s = cls(
            seed=seed, partition_key=rng.choice(PARTITION_KEYS), tables=tables,
            triggers=triggers, ddl=ddl, toast_table=rng.choice(keyed), keyless=keyless,
            rows=rows, load_s=load_s, kills=kills, kafka_restart=rng.random() < 0.5,
            engine_stop=rng.choice((None, "opensearch", "elasticsearch")),
        )  # fmt: skip
        s.timeline = s.plan(rng)
        # kafka2postgres's kill from a generator of its own, after everything else: the
        # other draws of a seed are what they were before it joined
        k2p = random.Random(seed ^ 0x6B3270)  # noqa: S311 - scenarios, not secrets
        if k2p.random() < 0.35:
            s.kills[K2P] = "timed"
            s.timeline = sorted([*s.timeline, (k2p.uniform(0.1, 0.9) * load_s, "kill", K2P)])
        else:
            s.kills[K2P] = f"kafka2postgres.applied=exit@{k2p.randint(1, 6)}"
        return s

    def plan(self, rng: random.Random) -> list[tuple[float, str, str]]:
        """When each step happens, in seconds from the start of the load."""
        d = self.load_s
        out: list[tuple[float, str, str]] = []
        for table, order in self.tables.items():
            if order != "initial":
                out.append((rng.uniform(0, 0.25) * d, "create", table))
            if order in ("drop_recreate", "truncate_reload"):
                out.append((rng.uniform(0.35, 0.65) * d, order, table))
        for kind, table in self.ddl:
            out.append((rng.uniform(0.3, 0.8) * d, kind, table))
        for trigger in ("signal", "cli"):
            if trigger in self.triggers:
                out.append((rng.uniform(0.3, 0.7) * d, trigger, rng.choice(sorted(self.tables))))
        for svc, how in self.kills.items():
            if how == "timed":
                out.append((rng.uniform(0.1, 0.9) * d, "kill", svc))
        if self.kafka_restart:
            out.append((rng.uniform(0.2, 0.8) * d, "restart_kafka", ""))
        if self.engine_stop:
            out.append((rng.uniform(0.2, 0.6) * d, "stop_engine", self.engine_stop))
        if self.keyless:
            out.append((rng.uniform(0.3, 0.7) * d, "truncate_keyless", KEYLESS))
        return sorted(out)

    def summary(self) -> str:
        orders = ", ".join(sorted(o for o in self.tables.values() if o != "initial"))
        ddl = ", ".join(k for k, _ in self.ddl)
        extras = ["keyless" if self.keyless else "", f"toast on {self.toast_table}"]
        return (
            f"key={self.partition_key}; orders: {orders}; snapshots: {', '.join(self.triggers)};"
            f" ddl: {ddl}; {'; '.join(e for e in extras if e)}"
        )


@dataclass
class RunReport:
    seed: int
    scenario: str
    events: int = 0
    faults: list[str] = field(default_factory=list)
    converge_s: float | None = None
    sink_converge_s: dict[str, float] = field(default_factory=dict)  # last seen behind
    mismatches: dict[str, dict[str, Any]] = field(default_factory=dict)
    defects: list[str] = field(default_factory=list)
    still_moving: list[str] = field(default_factory=list)  # sinks converging at the deadline
    lsn_order_violations: int = 0
    seconds: float = 0.0
    spark_starts_s: list[float] = field(default_factory=list)  # start to first batch
    # a failed run: the last lines of each service's log (the files go with the clean-up)
    log_tails: dict[str, list[str]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.mismatches or self.defects or self.lsn_order_violations)


def columns_differing(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Which columns of a row differ, each as ``name: postgres's value / the sink's``
    (long values by their length)."""

    def show(v: Any) -> str:
        return f"<{len(v)} chars>" if isinstance(v, str) and len(v) > 40 else repr(v)

    return [
        f"{c}: {show(want.get(c))} / {show(got.get(c))}"
        for c in sorted(want.keys() | got.keys())
        if want.get(c) != got.get(c)
    ]


def why(log: Path) -> str:
    """The reason a service gave for stopping: its last error line, else its last line."""
    lines = log.read_text(errors="replace").splitlines()
    errors = [line for line in lines if " ERROR " in line or "stopping" in line]
    return (errors or lines or ["(empty log)"])[-1][:600]


class Composition(Chaos):
    """One scenario through the pipeline (services as processes, as in the chaos suite)."""

    def __init__(self, cfg: Config, scenario: Scenario) -> None:
        super().__init__(cfg)
        self.sc = scenario
        self.rng = random.Random(scenario.seed ^ 0x5EED)  # noqa: S311 - pauses only
        self.keys = {t: "id" for t in scenario.tables}
        if scenario.keyless:
            self.keys[KEYLESS] = ""
        self.run_report = RunReport(scenario.seed, scenario.summary())
        self.ready: set[str] = set()  # keyed tables the load writes to
        self.next_id: dict[str, int] = {}
        self.lock = threading.Lock()  # one writer at a time: the load or a step
        self.svc_lock = threading.Lock()  # kills and restarts of the services
        self.stopping = threading.Event()
        self.frozen: threading.Thread | None = None  # the engine's freeze, when planned

    # -- set-up --------------------------------------------------------------------------

    def envs(self) -> dict[str, dict[str, str]]:
        out = super().envs()
        out["pg2kafka"].update({
            "PG2KAFKA_PRODUCER__PARTITION_KEY": self.sc.partition_key,
            "PG2KAFKA_SNAPSHOT__MODE": "initial",
            "PG2KAFKA_SNAPSHOT__AUTOMATIC": "true",
            "PG2KAFKA_SNAPSHOT__CHUNK_ROWS": str(max(50, self.sc.rows // 5)),  # 5+ chunks
            "PG2KAFKA_FILTERS__KEYLESS_TABLES": "inserts" if self.sc.keyless else "skip",
        })  # fmt: skip
        name = self.cfg.name.replace("_", "-")
        out[K2P] = {
            "KAFKA2POSTGRES_HTTP__PORT": "0",
            "KAFKA2POSTGRES_LOG__FORMAT": "text",
            "KAFKA2POSTGRES_CONSUMER__TOPICS": json.dumps([self.topic]),
            "KAFKA2POSTGRES_CONSUMER__GROUP_ID": f"{name}-postgres",
            "KAFKA2POSTGRES_CONSUMER__DLQ_TOPIC": f"{name}.postgres.dlq",
            "KAFKA2POSTGRES_CONSUMER__SESSION_TIMEOUT_MS": "6000",
            "KAFKA2POSTGRES_TARGET__POSTGRES__DATABASE": self.target_db,
        }
        return out

    @property
    def target_db(self) -> str:
        return f"k2p_{self.cfg.name}"[:63]

    def target_dsn(self) -> str:
        return self.dsn.rsplit("/", 1)[0] + f"/{self.target_db}"

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            with psycopg.connect(self.dsn, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{self.target_db}" WITH (FORCE)')  # type: ignore[arg-type]

    def setup(self) -> None:
        self.sql(f"CREATE SCHEMA {self.schema}")
        if INITIAL in self.sc.tables:
            self.create(INITIAL, "keys_first")  # rows before the slot: the initial snapshot
        envs = self.envs()
        self.cli(envs["pg2kafka"], "init")
        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.target_db}"')  # type: ignore[arg-type]
        for svc in (*SERVICES, K2P):
            module = svc.split("-")[0]
            self.services[svc] = s = Service(svc, module, envs[svc], self.cfg)
            if self.sc.kills[svc] != "timed":
                s.env["WALCAST_FAILPOINTS"] = self.sc.kills[svc]
            s.start()
        if self.sc.keyless:
            self.sql(f"CREATE TABLE {self.schema}.{KEYLESS} (n int, msg text)")
            self.sql(
                f"INSERT INTO {self.schema}.{KEYLESS} SELECT g % 7, 'same'"
                " FROM generate_series(1, 100) g"
            )  # equal rows: each must be held as many times as Postgres holds it

    def cli(self, env: dict[str, str], *args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "services.pg2kafka", "--env-file",
             str(Path(self.env["WALCAST_STACK_DIR"]) / "walcast.env"), *args],
            env={**os.environ, **env}, cwd=REPO, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pg2kafka {' '.join(args)}: {done.stderr[-2000:]}")

    # -- the load orders and steps -------------------------------------------------------

    def create(self, table: str, order: str, first: int = 1, n_base: int = 0) -> None:
        t, rows = f"{self.schema}.{table}", self.sc.rows
        toast = table == self.sc.toast_table
        fill = (
            f"SELECT g, {n_base}, 'note ' || g, 'd' || g, g % 100, {big('g', toast)}"
            f" FROM generate_series({first}, {first + rows - 1}) g"
        )
        if order in ("keys_first", "drop_recreate", "truncate_reload", "initial"):
            self.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, {COLUMNS})")
            self.sql(f"INSERT INTO {t} {fill}")
        elif order == "keys_after":
            self.sql(f"CREATE TABLE {t} (id int NOT NULL, {COLUMNS})")
            self.sql(f"INSERT INTO {t} {fill}")
            time.sleep(self.rng.uniform(0.5, 3))
            self.sql(f"ALTER TABLE {t} ADD PRIMARY KEY (id)")
        elif order == "ctas":
            self.sql(
                f"CREATE TABLE {t} AS SELECT g AS id, {n_base} AS n, 'note ' || g AS note,"
                f" 'd' || g AS dropme, g % 100 AS small, {big('g', toast)} AS big"
                f" FROM generate_series({first}, {first + rows - 1}) g"
            )
            time.sleep(self.rng.uniform(0.5, 3))
            self.sql(f"ALTER TABLE {t} ADD PRIMARY KEY (id)")
        self.next_id[table] = first + rows
        self.ready.add(table)

    def step(self, what: str, arg: str) -> None:
        t = f"{self.schema}.{arg}"
        if what == "create":
            self.create(arg, self.sc.tables[arg])
        elif what == "drop_recreate":
            with self.lock:
                self.ready.discard(arg)
                self.sql(f"DROP TABLE {t}")
            self.create(arg, "keys_first", first=self.sc.rows // 2, n_base=7)
        elif what == "truncate_reload":
            with self.lock:
                self.sql(f"TRUNCATE {t}")
                self.sql(
                    f"INSERT INTO {t} (id, n, big) SELECT g, 5,"  # columns no DDL touches
                    f" {big('g', arg == self.sc.toast_table)}"
                    f" FROM generate_series(1, {self.sc.rows // 2}) g"
                )
        elif what == "truncate_keyless":
            with self.lock:
                self.sql(f"TRUNCATE {t}")
        elif what in DDLS:
            self.ddl(what, t)
        elif what == "signal":
            self.sql(
                "INSERT INTO _walcast.snapshot_requests (publication, schema_name, table_name,"
                f" reason) VALUES ('{self.cfg.name}', '{self.schema}', '{arg}', 'requested')"
            )
        elif what == "cli":
            self.cli(self.envs()["pg2kafka"], "snapshot", "--table", f"{self.schema}.{arg}")
        elif what == "kill":
            with self.svc_lock:
                self.kill(arg)
        elif what == "restart_kafka":
            self.restart_kafka()
        elif what == "stop_engine":  # frozen meanwhile; the steps go on
            self.cfg.engine_stop_s = self.rng.uniform(5, 0.3 * self.sc.load_s)
            self.frozen = threading.Thread(target=self.stop_engine, args=(arg,), daemon=True)
            self.frozen.start()

    def ddl(self, kind: str, t: str) -> None:
        """Columns the load never writes: the DDL and the load do not wait on each other."""
        cols = {r[0] for r in self.sql(
            f"SELECT attname FROM pg_attribute WHERE attrelid = '{t}'::regclass AND attnum > 0"
            " AND NOT attisdropped")}  # fmt: skip
        with self.lock:
            if kind == "add_column" and "added" not in cols:
                self.sql(f"ALTER TABLE {t} ADD COLUMN added int")
            elif kind == "rename_column" and "note" in cols:
                self.sql(f"ALTER TABLE {t} RENAME COLUMN note TO remark")
            elif kind == "drop_column" and "dropme" in cols:
                self.sql(f"ALTER TABLE {t} DROP COLUMN dropme")
            elif kind == "type_change" and "small" in cols:
                self.sql(f"ALTER TABLE {t} ALTER COLUMN small TYPE bigint")

    def writes(self, stop: threading.Event) -> None:
        """Small transactions on the tables that have their key: updates (TOAST left
        unchanged, now and then replaced), inserts, deletes; inserts into the keyless one."""
        rng = random.Random(self.sc.seed ^ 0x10AD)  # noqa: S311
        conn: psycopg.Connection[Any] | None = None
        while not stop.is_set():
            try:
                conn = conn or psycopg.connect(self.dsn, autocommit=True)
                with self.lock:
                    tables = sorted(self.ready)
                    if tables:
                        self.one_transaction(conn, rng, rng.choice(tables))
                    if self.sc.keyless:
                        conn.execute(
                            f"INSERT INTO {self.schema}.{KEYLESS} SELECT %s, 'm' || g"
                            " FROM generate_series(1, %s) g",
                            [rng.randint(0, 5), rng.randint(1, 4)],
                        )
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(0.02)
        if conn is not None:
            conn.close()

    def one_transaction(
        self, conn: psycopg.Connection[Any], rng: random.Random, table: str
    ) -> None:
        t, top = f"{self.schema}.{table}", self.next_id[table]
        with conn.transaction():
            for _ in range(rng.randint(1, 5)):
                r = rng.random()
                if r < 0.6:
                    conn.execute(f"UPDATE {t} SET n = n + 1 WHERE id = %s", [rng.randint(1, top)])
                elif r < 0.8:
                    conn.execute(f"INSERT INTO {t} (id, n) VALUES (%s, 1)", [top])
                    self.next_id[table] = top = top + 1
                elif r < 0.95:
                    conn.execute(f"DELETE FROM {t} WHERE id = %s", [rng.randint(1, top)])
                elif table == self.sc.toast_table:
                    conn.execute(
                        f"UPDATE {t} SET big = {big('id + n', True)} WHERE id = %s",
                        [rng.randint(1, top)],
                    )

    # -- faults --------------------------------------------------------------------------

    def supervise(self) -> None:
        """Restart a service that died at its failpoint (armed once: it then runs
        without); a service that exits by itself otherwise is a defect, restarted too."""
        while not self.stopping.is_set():
            with self.svc_lock:
                for svc, s in self.services.items():
                    code = s.proc.poll() if s.proc is not None else None
                    if code is None or code == -9:
                        continue
                    if code == FAILPOINT_EXIT:
                        spec = s.env.pop("WALCAST_FAILPOINTS", "?")
                        self.run_report.faults.append(f"{svc} at {spec.split('=')[0]}")
                    else:
                        self.run_report.defects.append(f"{svc} exited {code}: {why(s.log)}")
                    s.start()
            time.sleep(0.5)

    def run_steps(self) -> None:
        stop = threading.Event()
        loader = threading.Thread(target=self.writes, args=(stop,), daemon=True)
        loader.start()
        started = time.monotonic()
        try:
            for at, what, arg in self.sc.timeline:
                time.sleep(max(0.0, started + at - time.monotonic()))
                if what in ("kill", "restart_kafka", "stop_engine"):
                    self.run_report.faults.append(f"{what} {arg}".strip())
                self.step(what, arg)
            time.sleep(max(0.0, started + self.sc.load_s - time.monotonic()))
        finally:
            stop.set()
            loader.join()
            if self.frozen is not None:
                self.frozen.join()

    # -- comparison (no walcast code) ----------------------------------------------------

    @staticmethod
    def clean(row: dict[str, Any]) -> dict[str, Any]:
        """A row without walcast's own columns; null and absent alike."""
        return {k: v for k, v in row.items() if v is not None and not k.startswith("_walcast")}

    def want(self, table: str) -> Rows:
        rows = self.sql(f"SELECT to_jsonb(x) FROM {self.schema}.{table} x")
        return self.shape(table, [r[0] for r in rows])

    def shape(self, table: str, rows: list[dict[str, Any]]) -> Rows:
        if key := self.keys[table]:
            return {str(r[key]): self.clean(r) for r in rows}
        return Counter(json.dumps(self.clean(r), sort_keys=True) for r in rows)

    def got(self, sink: str, table: str) -> Rows:
        if sink == "postgres":
            with psycopg.connect(self.target_dsn(), autocommit=True) as c:
                name = f'"{self.schema}"."{table}"'
                if c.execute("SELECT to_regclass(%s)", [name]).fetchone() == (None,):
                    return self.shape(table, [])
                rows = c.execute(f"SELECT to_jsonb(x) FROM {name} x").fetchall()
            return self.shape(table, [r[0] for r in rows])
        if sink == "delta":
            path = self.delta / f"{self.schema}.{table}"
            if not any((path / "_delta_log").glob("*.json")):
                return self.shape(table, [])
            return self.shape(table, DeltaTable(str(path)).to_pyarrow_table().to_pylist())
        return self.shape(table, list(self.index_rows(sink, table).values()))

    def compare(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        want = {t: self.want(t) for t in self.keys}
        for sink in SINKS:
            for t, w in want.items():
                try:
                    g = self.got(sink, t)
                except Exception as exc:  # noqa: BLE001 - a sink not readable yet: a difference
                    out[f"{sink}:{t}"] = {"unreadable": 1, "examples": [str(exc)[:200]]}
                    continue
                if isinstance(w, Counter):
                    assert isinstance(g, Counter)
                    missing, extra = w - g, g - w
                    d = {"missing": sum(missing.values()), "extra": sum(extra.values())}
                    examples = list(missing)[:2] + list(extra)[:2]
                else:
                    assert not isinstance(g, Counter)
                    assert not isinstance(w, Counter)
                    differ = [k for k, v in w.items() if k in g and g[k] != v]
                    d = {"missing": len(w.keys() - g.keys()), "extra": len(g.keys() - w.keys()),
                         "differ": len(differ)}  # fmt: skip
                    examples = sorted(w.keys() - g.keys(), key=int)[:3] + sorted(
                        g.keys() - w.keys(), key=int)[:3] + [
                        f"{k} ({', '.join(columns_differing(w[k], g[k]))})" for k in differ[:3]
                    ]  # fmt: skip
                if any(d.values()):
                    out[f"{sink}:{t}"] = {**d, "examples": examples}
        return out

    def converge(self) -> None:
        """Until every sink equals Postgres. Gives up after ``converge_timeout_s`` without
        progress (the differences not going down: a slow machine is not a defect) or
        three times that in all; then the differences, and the sinks still catching up
        (``still_moving``: their differences went down in the last minute)."""
        stopped = last_progress = time.monotonic()
        best: int | None = None
        history: list[tuple[float, dict[str, int]]] = []
        while True:
            began = time.monotonic()
            diff = self.compare()
            now = time.monotonic()
            at = round(now - stopped, 1)
            for sink in SINKS:  # when each was last behind
                if any(k.startswith(sink + ":") for k in diff):
                    self.run_report.sink_converge_s[sink] = at
            if not diff:
                self.run_report.converge_s = at
                self.run_report.mismatches = {}
                return
            per_sink = Counter[str]()
            for where, d in diff.items():
                per_sink[where.split(":")[0]] += sum(v for k, v in d.items() if k != "examples")
            history.append((now, dict(per_sink)))
            total = sum(per_sink.values())
            if best is None or total < best:
                best, last_progress = total, now
            timeout = self.cfg.converge_timeout_s
            if now - last_progress > timeout or now - stopped > 3 * timeout:
                self.run_report.mismatches = diff
                old = next((h for t, h in history if t >= now - 60), history[0][1])
                self.run_report.still_moving = sorted(
                    s for s, n in per_sink.items() if n < old.get(s, 0)
                )
                return
            # reading every sink whole takes a while on a big table: never more than half
            # the machine's time for the comparison, the sinks need the rest
            time.sleep(max(3.0, now - began))

    # -- the run -------------------------------------------------------------------------

    def run_scenario(self) -> RunReport:
        began = time.monotonic()
        watcher = threading.Thread(target=self.supervise, daemon=True)
        try:
            self.setup()
            watcher.start()
            self.run_steps()
            self.converge()
            self.lsn_order()
            self.run_report.events = self.report.events
            self.run_report.lsn_order_violations = self.report.lsn_order_violations
        finally:
            self.stopping.set()
            if watcher.is_alive():
                watcher.join()
            for s in self.services.values():
                s.stop()
        if "kafka2spark" in self.services:
            timings = spark_timings(self.services["kafka2spark"].log)
            self.run_report.spark_starts_s = timings.get("start_to_first_batch_s", [])
        self.run_report.seconds = round(time.monotonic() - began, 1)
        if self.run_report.failed:
            for svc, s in self.services.items():
                lines = s.log.read_text(errors="replace").splitlines() if s.log.exists() else []
                # librdkafka's own connection lines ("%3|…") drown the service's
                lines = [line for line in lines if not line.startswith("%")]
                self.run_report.log_tails[svc] = [line[:300] for line in lines[-25:]]
        return self.run_report


def run_one(
    seed: int,
    rows: int,
    load_s: float,
    keyless: bool,
    timeout_s: float,
    name: str = "",
    keep: bool = False,
    keep_failed: bool = False,
) -> RunReport:
    """One scenario from ``seed``, cleaned up afterwards (schema, slot, topics, indices)
    unless ``keep`` (or ``keep_failed`` and it failed); ``name`` (default: from the pid
    and seed) names the slot, schema, topic and indices."""
    scenario = Scenario.draw(seed, rows, load_s, keyless)
    name = name or f"comp_{os.getpid()}_{seed}"
    cfg = Config(name=name, seed=seed, converge_timeout_s=timeout_s)
    comp = Composition(cfg, scenario)
    report: RunReport | None = None
    try:
        report = comp.run_scenario()
        return report
    finally:
        if keep or (keep_failed and (report is None or report.failed)):
            print(f"kept for diagnosis: schema/slot/topic {name}, logs and Delta in {cfg.work}")
        else:
            comp.cleanup()


def print_run(r: RunReport) -> None:
    print(f"seed {r.seed}: {r.scenario}")
    conv = f"{r.converge_s} s" if r.converge_s is not None else "NO (deadline)"
    print(f"  events {r.events:,}; faults ({len(r.faults)}): {', '.join(r.faults) or '-'}")
    behind = ", ".join(f"{k} {v} s" for k, v in sorted(r.sink_converge_s.items()))
    print(f"  converged after the load: {conv} (last behind: {behind or '-'}); run {r.seconds} s")
    print(f"  kafka2spark from each start to its first batch: {r.spark_starts_s} s")
    if r.mismatches:
        print("  mismatches (sink:table missing/extra/differ, example keys):")
        for where, d in sorted(r.mismatches.items()):
            counts = ", ".join(f"{k} {v}" for k, v in d.items() if k != "examples")
            print(f"    {where}: {counts}; e.g. {d.get('examples')}")
    if r.still_moving:
        print(f"  still catching up at the deadline (slow, maybe not wrong): {r.still_moving}")
    for defect in r.defects:
        print(f"  DEFECT: {defect[:600]}")
    for svc, lines in r.log_tails.items():
        print(f"  --- the end of {svc}'s log:")
        for line in lines:
            print(f"    {line}")
    if r.lsn_order_violations:
        print(f"  per-key LSN order violations: {r.lsn_order_violations}")
    print(f"  -> {'FAIL: replay with --seed ' + str(r.seed) if r.failed else 'ok'}")


def print_table(runs: list[RunReport]) -> None:
    print(f"\n{'seed':>10}  {'events':>7}  {'faults':>6}  {'conv s':>7}  mismatches")
    for r in runs:
        conv = f"{r.converge_s}" if r.converge_s is not None else "-"
        mis = ", ".join(
            f"{k}:{sum(v for n, v in d.items() if n != 'examples')}"
            for k, d in r.mismatches.items()
        )
        print(f"{r.seed:>10}  {r.events:>7}  {len(r.faults):>6}  {conv:>7}  {mis or '0'}"
              + ("  DEFECT" if r.defects else ""))  # fmt: skip


def write_json(path: Path, runs: list[RunReport], keyless: bool) -> dict[str, Any]:
    """The runs so far and their summary into ``path``; the summary."""
    conv = sorted(r.converge_s for r in runs if r.converge_s is not None)
    summary = {
        "scenarios": len(runs),
        "events": sum(r.events for r in runs),
        "faults": sum(len(r.faults) for r in runs),
        "converge_s_median": conv[len(conv) // 2] if conv else None,
        "converge_s_max": conv[-1] if conv else None,
        "failed_seeds": [r.seed for r in runs if r.failed],
        "keyless": keyless,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"summary": summary, "runs": [asdict(r) for r in runs]}
    path.write_text(json.dumps(body, indent=2, default=str))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, help="replay this one scenario")
    p.add_argument("--runs", type=int, default=1, help="scenarios from random seeds")
    p.add_argument("--rows", type=int, default=1500, help="rows per table as loaded")
    p.add_argument("--load-s", type=float, default=60, help="seconds of load per scenario")
    p.add_argument("--timeout", type=float, default=300, help="seconds without progress")
    p.add_argument("--no-keyless", action="store_true", help="leave the keyless table out")
    p.add_argument("--keep", action="store_true", help="keep what a run made, to diagnose it")
    p.add_argument(
        "--keep-failed", action="store_true", help="keep what a failed run made (logs, Delta)"
    )
    p.add_argument("--json", type=Path, default=REPO / "bench/results/composition.json")
    args = p.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else [
        random.SystemRandom().randrange(1, 2**31) for _ in range(args.runs)
    ]  # fmt: skip
    runs: list[RunReport] = []
    for seed in seeds:
        print(f"=== seed {seed}", flush=True)
        r = run_one(
            seed,
            args.rows,
            args.load_s,
            not args.no_keyless,
            args.timeout,
            keep=args.keep,
            keep_failed=args.keep_failed,
        )
        runs.append(r)
        print_run(r)
        summary = write_json(args.json, runs, not args.no_keyless)  # after each run
        sys.stdout.flush()
    print_table(runs)
    print(f"\n{json.dumps(summary)}")
    failed = summary["failed_seeds"]
    for seed in failed:
        print(f"FAILED: replay with  python bench/composition.py --seed {seed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
