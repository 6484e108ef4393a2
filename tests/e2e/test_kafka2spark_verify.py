"""kafka2spark's ``verify`` with kafka2spark as a real process (``python -m
services.kafka2spark run``), fed by pg2kafka as a process:

- the continuous mode inside the running service (``verify.interval_s``): the table's
  outcome in ``status`` and in ``/metrics``, and a row deleted from the mirror behind
  walcast's back turns it into a difference with the row's key; then ``kafka2spark
  verify`` killed with its marker written and ``kafka2spark repair`` killed with its
  snapshot of key ranges filed, each run again: the repair mends the row, the
  verification says equal;
- a repair while kafka2spark is down, then killed at a failpoint right after a micro-batch
  is written to Delta, before its offsets are committed (the batch, and any ``range_end``
  marker in it, applied again after the restart), ends with the mirror equal to the
  table, read with deltalake and compared with plain SQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from services.kafka2spark import admin as spark_admin
from services.kafka2spark.settings import Kafka2SparkSettings
from services.kafka2spark.verify import repair, verify
from services.pg2kafka.settings import Pg2KafkaSettings
from shared.failpoints import ENV, EXIT_CODE
from shared.settings import VerifySettings, load_settings
from shared.verify.repair import RepairReport
from tests.e2e.conftest import Proc, wait_until, write_rows
from tests.e2e.test_kafka2spark_crash import delta_rows, flow, pg_rows, start  # noqa: F401

# repairs: a checkpoint every second (tests/conftest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("slots_move_often")]

ROWS = 1500


def verify_env(run: Any) -> dict[str, str]:
    """The ``verify`` section of a kafka2spark process, from the stack's source settings."""
    pg = load_settings(Pg2KafkaSettings, env_file=run["env_file"]).postgres
    return {
        "KAFKA2SPARK_VERIFY__POSTGRES__HOST": pg.host,
        "KAFKA2SPARK_VERIFY__POSTGRES__PORT": str(pg.port),
        "KAFKA2SPARK_VERIFY__POSTGRES__DATABASE": pg.database,
        "KAFKA2SPARK_VERIFY__POSTGRES__USER": pg.user,
        "KAFKA2SPARK_VERIFY__POSTGRES__PASSWORD": pg.password.get_secret_value(),
        "KAFKA2SPARK_VERIFY__SLOT": run["pg_env"]["PG2KAFKA_REPLICATION__SLOT"],
        "KAFKA2SPARK_VERIFY__RANGE_ROWS": "200",
        "KAFKA2SPARK_VERIFY__MARK_TIMEOUT_S": "240",
    }


def verify_settings(run: Any) -> Kafka2SparkSettings:
    pg = load_settings(Pg2KafkaSettings, env_file=run["env_file"]).postgres
    spark: Kafka2SparkSettings = run["spark"]
    section = VerifySettings(
        postgres=pg, slot=run["pg_env"]["PG2KAFKA_REPLICATION__SLOT"], range_rows=200,
        mark_timeout_s=240,
    )  # fmt: skip
    return spark.model_copy(update={"verify": section})


def mirror_path(run: Any) -> Path:
    path: Path = run["root"] / f"public.{run['table']}"
    return path


def caught_up(run: Any, procs: list[Proc]) -> None:
    want = pg_rows(run)

    def equal() -> bool:
        dead = [p for p in procs if not p.alive() and p.popen.returncode not in (0, -9, EXIT_CODE)]
        assert not dead, dead[0].tail(60)
        if not any((mirror_path(run) / "_delta_log").glob("*.json")):
            return False  # its first commit not made yet (the directory comes before it)
        return delta_rows(run) == want

    wait_until(equal, "the mirror to equal the table", 300, interval=2)


def batches_committed(run: Any) -> None:
    """Wait until the query's checkpoint has committed every micro-batch it planned: a
    kill -9 before that makes the next start run the last batch again — over the mirror
    as it then is, mending what a test changed in it behind walcast's back."""
    checkpoint = run["root"] / "_checkpoints" / "mirror"

    def ids(kind: str) -> set[int]:
        return {int(f.name) for f in (checkpoint / kind).glob("[0-9]*")}

    wait_until(
        lambda: bool(ids("offsets")) and max(ids("offsets")) in ids("commits"),
        "the query's last micro-batch committed in its checkpoint", 120, interval=0.5,
    )  # fmt: skip


def metric(port: int, name: str, table: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.search(rf'^{name}\{{table="{re.escape(table)}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def test_the_continuous_mode_in_the_running_service(
    flow: Any,  # noqa: F811 - the fixture
    procs: list[Proc],
    tmp_path: Path,
) -> None:
    start(flow, procs, tmp_path, "pg2kafka")
    write_rows(flow["dsn"], flow["table"], 1, ROWS)
    flow["spark_env"] = {**flow["spark_env"], **verify_env(flow),
                         "KAFKA2SPARK_VERIFY__INTERVAL_S": "1"}  # fmt: skip
    start(flow, procs, tmp_path, "kafka2spark")
    caught_up(flow, procs)
    name = f"public.{flow['table']}"

    def outcome() -> dict[str, Any] | None:
        got = [o for o in spark_admin.status(flow["spark"])["verify"] if o["table"] == name]
        return got[0] if got else None

    wait_until(lambda: (o := outcome()) is not None and o.get("ok") is True,
               "an equal outcome in status", 240, interval=1)  # fmt: skip
    assert metric(flow["port"], "walcast_verify_differences", name) == 0
    assert (metric(flow["port"], "walcast_verify_last_success_timestamp", name) or 0) > 0

    DeltaTable(str(mirror_path(flow))).delete("id = 42")  # behind walcast's back
    wait_until(lambda: (o := outcome()) is not None and o.get("ok") is False,
               "a differing outcome in status", 240, interval=1)  # fmt: skip
    o = outcome()
    assert o is not None
    assert o["missing"] == {"count": 1, "sample": [42]}, o
    wait_until(lambda: metric(flow["port"], "walcast_verify_differences", name) == 1,
               "the difference in /metrics", 60)  # fmt: skip

    # The command line, killed at its worst moments, then run again: a verify killed with
    # its marker written, a repair killed with its snapshot of key ranges filed.
    assert cli(flow, "verify", name, "verify.marked=exit").returncode == EXIT_CODE
    assert cli(flow, "repair", name, "repair.requested=exit").returncode == EXIT_CODE
    again = cli(flow, "repair", name)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    caught_up(flow, procs)  # row 42 is back (by either repair)
    final = cli(flow, "verify", name)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert json.loads(final.stdout)["tables"][0]["ok"] is True


def cli(
    run: Any, command: str, table: str, failpoints: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python -m services.kafka2spark verify|repair --table T --json`` as its own process,
    with the running service's settings; ``failpoints``: where it dies."""
    env = {**os.environ, **run["spark_env"], **verify_env(run), ENV: failpoints}
    return subprocess.run(
        [sys.executable, "-m", "services.kafka2spark", "--env-file", str(run["env_file"]),
         command, "--table", table, "--json"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_a_repair_with_kafka2spark_killed_after_writing_batches_ends_equal(
    flow: Any,  # noqa: F811 - the fixture
    procs: list[Proc],
    tmp_path: Path,
) -> None:
    start(flow, procs, tmp_path, "pg2kafka")
    write_rows(flow["dsn"], flow["table"], 1, ROWS)
    first = start(flow, procs, tmp_path, "kafka2spark")
    caught_up(flow, procs)
    batches_committed(flow)
    first.kill9()
    path = str(mirror_path(flow))
    DeltaTable(path).delete("id = 5 OR id = 1200")  # missing
    DeltaTable(path).update(predicate="id = 700", updates={"v": "99"})  # edited in the mirror
    with psycopg.connect(flow["dsn"], autocommit=True) as c:  # moves on meanwhile
        c.execute(f"UPDATE {flow['table']} SET v = v + 1 WHERE id BETWEEN 300 AND 320")

    settings = verify_settings(flow)
    reports: list[RepairReport] = []
    failures: list[BaseException] = []

    def run_repair() -> None:
        try:
            reports.extend(repair(settings, [("public", flow["table"])]))
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            failures.append(exc)

    t = threading.Thread(target=run_repair, daemon=True)
    t.start()
    # kafka2spark started with a kill right after writing its 2nd micro-batch, then left
    # to run: batches of 50 records, so the verify markers, the repair's read rows and its
    # range_end marker spread over several batches
    for nth in (2,):
        env = {**flow["spark_env"], "KAFKA2SPARK_SOURCE__MAX_OFFSETS_PER_TRIGGER": "50",
               "WALCAST_FAILPOINTS": f"kafka2spark.batch_written=exit@{nth}"}  # fmt: skip
        job = Proc("kafka2spark", ["--env-file", str(flow["env_file"]), "run"], env,
                   tmp_path / f"kafka2spark-exit-{nth}.log")  # fmt: skip
        procs.append(job)
        wait_until(lambda j=job: not j.alive(), f"kafka2spark to exit at its batch {nth}", 300)
        assert job.popen.returncode == EXIT_CODE, job.tail(60)
    start(flow, procs, tmp_path, "kafka2spark")
    t.join(600)
    assert not t.is_alive(), "the repair did not finish"
    assert not failures, failures
    (report,) = reports
    d = report.as_dict()
    assert report.ok, d
    found = d["found"]
    assert found["missing"]["sample"] == [5, 1200], found
    assert found["edited_in_sink"]["sample"] == [700], found
    caught_up(flow, procs)
    (again,) = verify(settings, [("public", flow["table"])])
    assert again.ok, again.as_dict()
