"""A repair under kills, driven by failpoints: an index damaged behind walcast's back (documents
deleted, documents added, rows updated and deleted in Postgres with the slot moved past
them) gets a repair's snapshot of key ranges, and pg2kafka is killed at each chunk boundary
of it in turn (read; sent, not yet recorded; recorded) — the ``range_end`` marker is then
sent again after a kill, and applied again — while the indexer is stopped and started in
between. Every restart resumes; the index ends equal to the table, compared by plain HTTP
and SQL (no walcast module reads either side)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from services.pg2kafka import admin
from tests.e2e.conftest import Proc, wait_until
from tests.e2e.test_snapshot_kills import (
    EXIT,
    Stream,
    engine_docs,
    no_unhandled_errors,
    sql,
    topic_events,
)
from tests.integration.conftest import difference, env_file  # noqa: F401 - fixture
from tests.integration.kafka2search.conftest import (  # noqa: F401 - fixtures
    IndexerFactory,
    make_indexer,
)

# repairs: a checkpoint every second (tests/conftest.py)
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("slots_move_often")]


@pytest.fixture
def engine_kind() -> str:
    """OpenSearch: the engines share the range end marker's code path, which
    tests/integration/kafka2search/test_repair.py runs on both."""
    return "opensearch"


ROWS = 600
PLACES = ["incremental.chunk_read", "incremental.chunk_sent", "incremental.chunk_done"]


def call(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(url.rstrip("/") + path, method=method,  # noqa: S310
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - the stack's URL
        return json.loads(r.read() or b"{}")


def test_a_repair_killed_at_every_chunk_boundary_ends_with_the_index_equal(
    stack_env: dict[str, str],
    make_indexer: IndexerFactory,  # noqa: F811
    unique_name: str,
    tmp_path: Path,
) -> None:
    s = Stream(stack_env, unique_name, tmp_path, "primary_key", mode="initial", chunk_rows=15)
    indexers: list[Any] = []
    t = f'"{s.schema}".items'

    def table() -> dict[str, dict[str, Any]]:
        return {str(r[0]): {"id": r[0], "v": r[1]} for r in sql(s.dsn, f"SELECT id, v FROM {t}")}

    try:
        sql(s.dsn, f'CREATE SCHEMA "{s.schema}"')
        sql(s.dsn, f"CREATE TABLE {t} (id int PRIMARY KEY, v int)")
        sql(s.dsn, f"INSERT INTO {t} SELECT g, g FROM generate_series(1, {ROWS}) g")
        admin.init(s.settings)
        p = s.start()
        bootstrap = s.settings.kafka.bootstrap_servers
        wait_until(lambda: len(topic_events(bootstrap, s.topic)) >= ROWS,
                   f"the initial snapshot in Kafka\n{p.tail()}", 180)  # fmt: skip
        ix = make_indexer(s.topic).start()
        indexers.append(ix)
        url, alias = ix.settings.engine.urls[0], ix.alias("items", s.schema)

        def docs() -> dict[str, dict[str, Any]]:
            try:
                return engine_docs(url, alias)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return {}  # the index is not made yet
                raise

        wait_until(lambda: docs() == table(), "the index caught up", 180)

        # Behind walcast's back: documents deleted and added, rows changed with the slot
        # moved past them.
        for k in range(10, 41):
            call(url, "DELETE", f"/{alias}/_doc/{k}")
        for k in (ROWS + 7, ROWS + 70):
            call(url, "PUT", f"/{alias}/_doc/{k}", {"id": k, "v": -1})
        p.stop()
        sql(s.dsn, f"UPDATE {t} SET v = -v WHERE id BETWEEN 100 AND 130")
        sql(s.dsn, f"DELETE FROM {t} WHERE id BETWEEN 200 AND 205")
        sql(s.dsn, "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
            [s.settings.replication.slot])  # fmt: skip
        assert docs() != table()

        # The request `repair` files for that damage: ranges around each difference.
        ranges = [[[9], [40]], [[99], [130]], [[199], [205]], [[ROWS], None]]
        ids = [r[0] for r in sql(s.dsn, f"SELECT * FROM _walcast.request_repair('{t}',"
                                 " %s::jsonb)", [json.dumps(ranges)])]  # fmt: skip
        # this stream's request (one is filed per publication that holds the table)
        (rid,) = sql(s.dsn, "SELECT id FROM _walcast.snapshot_requests"
                     " WHERE id = ANY(%s) AND publication = %s",
                     [ids, s.settings.replication.publication])[0]  # fmt: skip

        def state() -> str:
            return str(sql(s.dsn, "SELECT state FROM _walcast.repair_progress(%s)", [[rid]])[0][0])

        kills = restarts = 0
        while state() != "done":
            place = PLACES[restarts % len(PLACES)]
            proc = s.start(f"{place}=exit@1")

            def over(proc: Proc = proc) -> bool:
                return not proc.alive() or state() == "done"

            wait_until(over, f"pg2kafka to die at {place} or finish\n{proc.tail()}", 180)
            if proc.alive():
                proc.stop()
            else:
                assert proc.popen.returncode == EXIT, f"not the failpoint's exit\n{proc.tail()}"
                kills += 1
            restarts += 1
            if restarts == 2:  # the indexer stopped and started again mid-repair
                ix.stop()
                ix = make_indexer(s.topic).start()
                indexers.append(ix)
            assert restarts < 60, "the repair's snapshot did not finish"
        assert kills >= 3, f"only {kills} kills: the repair had too few chunks to test"

        s.start()
        deadline = time.monotonic() + 180
        while (got := docs()) != (want := table()) and time.monotonic() < deadline:
            time.sleep(1)
        assert difference(want, got) == ([], [], []), (kills, restarts)
        no_unhandled_errors(s)
    finally:
        for one in indexers:  # before their topic goes: a stop commits offsets there
            one.stop()
        s.close()
