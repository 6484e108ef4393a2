"""pgbench as a workload for end-to-end tests, and reading each copy of its tables without
walcast's code: Postgres with plain SQL, the search index with plain HTTP, the Delta
mirror with the ``deltalake`` reader; :func:`converge` waits until a copy equals
Postgres."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from tests.e2e.conftest import Proc

TABLES = {"pgbench_branches": "bid", "pgbench_tellers": "tid", "pgbench_accounts": "aid"}


def pgbench_binary() -> str:
    found = shutil.which("pgbench") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None
    )
    if found is None:
        pytest.fail("pgbench not found: the local stack installs it with PostgreSQL")
    return found


class Pgbench:
    def __init__(self, binary: str, dsn: str, schema: str) -> None:
        self.binary, self.dsn, self.schema = binary, dsn, schema

    def run(self, *args: str) -> str:
        env = {**os.environ, "PGOPTIONS": f"-c search_path={self.schema}"}
        done = subprocess.run(
            [self.binary, *args, self.dsn], env=env, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"pgbench {' '.join(args)}: {done.stderr[-2000:]}"
        return done.stdout


def http(base: str, path: str, body: Any = None, method: str = "GET", missing: str = "") -> str:
    """A plain HTTP request to the search engine (no walcast code); ``missing`` is the
    answer to a 404."""
    data = json.dumps(body).encode() if body is not None else None
    assert base.startswith("http")
    req = urllib.request.Request(base + path, data=data, method=method if data is None else "POST")  # noqa: S310
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310
            return resp.read().decode()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and missing:
            return missing
        raise


def pg_rows(flow: Any, table: str) -> dict[str, dict[str, Any]]:
    key = TABLES[table]
    with psycopg.connect(flow["dsn"], autocommit=True) as c:
        cur = c.execute(f"SELECT {key}, to_jsonb(x) FROM {flow['schema']}.{table} x")
        return {str(r[0]): r[1] for r in cur}


def index_rows(flow: Any, table: str) -> dict[str, dict[str, Any]]:
    base, alias = flow["search_url"], flow["alias"].format(table=table)
    if http(base, f"/_alias/{alias}", missing="{}") == "{}":
        return {}
    http(base, f"/{alias}/_refresh", method="POST")
    out: dict[str, dict[str, Any]] = {}
    page = json.loads(
        http(
            base,
            f"/{alias}/_search?scroll=1m",
            {
                "size": 5000,
                "sort": ["_doc"],
                "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]},
            },
        )
    )
    while page["hits"]["hits"]:
        out.update({h["_id"]: h["_source"] for h in page["hits"]["hits"]})
        more = {"scroll": "1m", "scroll_id": page["_scroll_id"]}
        page = json.loads(http(base, "/_search/scroll", more))
    return out


def delta_rows(flow: Any, table: str) -> dict[str, dict[str, Any]]:
    path = flow["root"] / f"{flow['schema']}.{table}"
    if not any((path / "_delta_log").glob("*.json")):  # not created yet, or being created
        return {}
    key = TABLES[table]
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {str(r[key]): {k: v for k, v in r.items() if not k.startswith("_walcast_")}
           for r in rows}  # fmt: skip


def converge(
    flow: Any, procs: list[Proc], sink: str, read: Callable[[Any, str], dict[str, Any]]
) -> None:
    """Wait until every table's copy in ``sink`` equals Postgres; fail when the number of
    matching rows stops improving for 180 s (a loaded CI host is slow, not stuck),
    saying what differs."""
    want = {t: pg_rows(flow, t) for t in TABLES}
    best, last_progress = -1, time.monotonic()
    while True:
        looked = time.monotonic()
        got = {t: read(flow, t) for t in TABLES}
        looked = time.monotonic() - looked
        if got == want:
            return
        good = sum(1 for t in TABLES for k, v in want[t].items() if got[t].get(k) == v)
        if good > best:
            best, last_progress = good, time.monotonic()
        dead = [p for p in procs if not p.alive()]
        assert not dead, f"{dead[0].log.name} exited:\n{dead[0].tail()}"
        if time.monotonic() - last_progress > 180:
            report = {
                t: {
                    "missing": len(set(want[t]) - set(got[t])),
                    "extra": len(set(got[t]) - set(want[t])),
                    "differ": sum(1 for k in want[t] if k in got[t] and got[t][k] != want[t][k]),
                }
                for t in TABLES
            }
            pytest.fail(f"{sink} != Postgres, no progress for 180 s: {report}")
        time.sleep(max(2.0, looked))  # a look reads the sink whole: not most of the time
