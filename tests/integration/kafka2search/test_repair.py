"""``kafka2search repair`` against the real services (pg2kafka streaming, kafka2search
indexing, both engines): differences made behind walcast's back — a document deleted, one
added, a row updated and one deleted in Postgres with the slot moved past them — are found,
read again by a snapshot of their key ranges, and gone: the index then equals the table,
compared by a plain read of each side, and no document outside those ranges was written
again. A repair while writers keep changing the same rows ends with the index equal to the
table and reports no difference left."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import psycopg
import pytest

from services.kafka2search.verify import repair, verify
from shared.cli import with_values
from tests.integration.conftest import Harness, HarnessFactory
from tests.integration.kafka2search.conftest import Indexer, IndexerFactory
from tests.integration.kafka2search.test_verify import ROWS, pipeline

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py


def table_rows(h: Harness, schema: str) -> dict[int, tuple[Any, ...]]:
    return {r[0]: r for r in h.sql(f'SELECT id, v, n, b FROM "{schema}".t')}


def index_rows(ix: Indexer, schema: str) -> dict[int, tuple[Any, ...]]:
    docs = ix.docs_all("t", schema).values()
    return {d["id"]: (d["id"], d.get("v"), d.get("n"), d.get("b")) for d in docs}


def versions(ix: Indexer, alias: str) -> dict[str, int]:
    body: dict[str, Any] = {"size": 10_000, "_source": False, "version": True,
                            "sort": ["_doc"], "query": {"match_all": {}}}  # fmt: skip
    hits = ix.es.request("POST", f"/{alias}/_search", body=body)["hits"]["hits"]
    return {h["_id"]: int(h["_version"]) for h in hits}


def behind_walcasts_back(h: Harness, ix: Indexer, schema: str, alias: str) -> None:
    ix.es.request("DELETE", f"/{alias}/_doc/7", params={"refresh": "true"})
    ix.es.request(
        "PUT", f"/{alias}/_doc/{ROWS + 50}", body={"id": ROWS + 50, "v": "intruder"},
        params={"refresh": "true"},
    )  # fmt: skip
    ix.es.request(  # a value changed through the engine's API (seen with verify.values)
        "POST", f"/{alias}/_update/450", body={"doc": {"v": "edited"}}, params={"refresh": "true"}
    )
    h.stop()  # changes the slot is moved past: they never reach Kafka
    h.sql(f"UPDATE \"{schema}\".t SET v = 'bypassed' WHERE id = 9")
    h.sql(f'DELETE FROM "{schema}".t WHERE id = 300')
    h.sql(
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
        [h.settings.replication.slot],
    )
    h.start()


def test_each_difference_is_read_again_and_nothing_else_is_touched(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    schema = f"rp_{unique_name}"
    h, ix, settings = pipeline(make_harness, make_indexer, schema)
    alias = ix.alias("t", schema)
    behind_walcasts_back(h, ix, schema, alias)
    before = versions(ix, alias)

    (report,) = repair(with_values(settings, True), [(schema, "t")])
    d = report.as_dict()
    assert report.ok, d
    found = d["found"]
    assert (found["missing"]["sample"], found["extra"]["sample"], found["differs"]["sample"]) == (
        [7], [300, ROWS + 50], [9, 450]
    ), found  # fmt: skip
    assert found["edited_in_sink"]["sample"] == [450], found
    assert {k: v["sample"] for k, v in d["repaired"].items() if v["count"]} == {
        "missing": [7], "extra": [300, ROWS + 50], "differs": [9, 450]
    }  # fmt: skip
    assert d["attempts"] == 1, json.dumps(d)

    ix.wait(lambda: index_rows(ix, schema) == table_rows(h, schema), "the index equals the table")
    after = versions(ix, alias)
    touched = {k for k in before.keys() & after.keys() if before[k] != after[k]}
    assert touched == {"9", "450"}, touched  # 7 came back; 300 and ROWS + 50 went
    assert set(after) == (set(before) | {"7"}) - {"300", str(ROWS + 50)}
    (again,) = verify(with_values(settings, True), [(schema, "t")])
    assert again.ok, again.as_dict()
    assert again.looked_into == 0


@pytest.mark.parametrize("engine_kind", ["opensearch"])  # the first test runs both engines
def test_a_repair_while_writers_change_the_same_rows_ends_equal(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    schema = f"rw_{unique_name}"
    h, ix, settings = pipeline(make_harness, make_indexer, schema)
    alias = ix.alias("t", schema)
    for k in range(10, 31):  # (a minimal Elasticsearch has no _delete_by_query)
        ix.es.request("DELETE", f"/{alias}/_doc/{k}")
    behind_walcasts_back(h, ix, schema, alias)
    stop = threading.Event()
    written = [0]

    def writer() -> None:  # TPC-B's shape: small transactions on random rows, the same ones
        rnd = random.Random(11)
        with psycopg.connect(h.dsn, autocommit=True) as conn:
            while not stop.is_set():
                with conn.transaction():
                    for _ in range(3):
                        k = rnd.choice([*range(5, 35), *range(295, 305), rnd.randint(1, ROWS)])
                        conn.execute(
                            f'UPDATE "{schema}".t SET n = n + 1, v = %s WHERE id = %s',
                            [f"w{written[0]}", k],
                        )
                written[0] += 1

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
    assert report.after is not None
    # Rows the writers touch come back through the stream on their own; the extra ones,
    # gone from Postgres, only a repair removes.
    assert {300, ROWS + 50} <= set(d["found"]["extra"]["sample"]), d
    ix.wait(lambda: index_rows(ix, schema) == table_rows(h, schema), "the index equals the table")
    (again,) = verify(settings, [(schema, "t")])
    assert again.ok, again.as_dict()
