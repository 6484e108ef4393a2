"""``kafka2spark repair`` against the real services (pg2kafka streaming, kafka2spark's
streaming query into Delta), while a writer keeps changing rows next to and among the
damaged ones: a Delta row deleted (missing), a row's key changed in Delta (one missing,
one extra), a row updated and one deleted in Postgres with the slot moved past them
(differs, extra), a value changed in Delta by another writer (differs, edited in the sink)
are found, read again by a snapshot of their key ranges — the extra rows
removed by its range end marker, in the stream — and the mirror then equals the table,
compared by a plain read of each side."""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from services.kafka2spark.verify import repair
from services.pg2kafka import admin
from tests.integration.conftest import Harness, HarnessFactory, keyed_source
from tests.integration.kafka2spark.conftest import MirrorFactory, verify_settings, wait_for
from tests.integration.kafka2spark.test_verify import Streaming

ROWS = 400

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py


def table_rows(h: Harness, schema: str) -> dict[int, tuple[Any, ...]]:
    return {r[0]: r for r in h.sql(f'SELECT id, v, n FROM "{schema}".t')}


def mirror_rows(path: Any) -> dict[int, tuple[Any, ...]]:
    if not any((path / "_delta_log").glob("*.json")):
        return {}  # not made yet (its log directory comes before its first commit)
    t = DeltaTable(str(path)).to_pyarrow_table(columns=["id", "v", "n"]).to_pylist()
    return {r["id"]: (r["id"], r["v"], r["n"]) for r in t}


def test_kafka2spark_repair_mends_each_difference_while_rows_change(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, unique_name: str
) -> None:
    schema = f"sr_{unique_name}"
    h = keyed_source(make_harness, schema)
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.t (id int PRIMARY KEY, v text, n int)")
    h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g, g FROM generate_series(1, {ROWS}) g")
    admin.init(h.settings)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    path = m.path("t", schema)
    streaming = Streaming(m).start()
    stop = threading.Event()
    written = [0]
    try:
        wait_for(
            lambda: len(mirror_rows(path)) == ROWS,
            "the mirror caught up",
            300,
        )
        settings = verify_settings(m, h.settings, range_rows=100)
        streaming.pause()
        DeltaTable(str(path)).delete("id = 7")  # behind walcast's back
        DeltaTable(str(path)).update(predicate="id = 5", updates={"id": "9999"})
        DeltaTable(str(path)).update(predicate="id = 3", updates={"v": "'edited'"})
        h.stop()
        h.sql(f"UPDATE {q}.t SET v = 'bypassed' WHERE id = 9")
        h.sql(f"DELETE FROM {q}.t WHERE id = 300")
        h.sql(
            "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
            [h.settings.replication.slot],
        )
        h.start()
        streaming.go.set()

        def writer() -> None:  # TPC-B's shape: small transactions on random rows
            rnd = random.Random(5)
            with psycopg.connect(h.dsn, autocommit=True) as conn:
                while not stop.is_set():
                    with conn.transaction():
                        for _ in range(3):
                            k = rnd.choice([4, 6, 8, 9, 10, 299, 301, rnd.randint(11, ROWS)])
                            conn.execute(
                                f"UPDATE {q}.t SET n = n + 1, v = %s WHERE id = %s",
                                [f"w{written[0]}", k],
                            )
                    written[0] += 1
                    stop.wait(0.05)

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            (report,) = repair(settings, [(schema, "t")])
        finally:
            stop.set()
            t.join(30)
        assert written[0] > 0
        d = report.as_dict()
        assert report.ok, d
        found = d["found"]
        assert {5, 7} <= set(found["missing"]["sample"]), found
        assert {300, 9999} <= set(found["extra"]["sample"]), found
        assert {300, 9999} <= set(d["repaired"]["extra"]["sample"]), d
        assert {5, 7} <= set(d["repaired"]["missing"]["sample"]), d
        assert found["edited_in_sink"]["sample"] == [3], found  # no writer touches 3
        assert 3 in d["repaired"]["differs"]["sample"], d
        wait_for(
            lambda: mirror_rows(path) == table_rows(h, schema), "the mirror equals the table", 300
        )
    finally:
        stop.set()
        streaming.stop()
    assert not streaming.errors, streaming.errors
