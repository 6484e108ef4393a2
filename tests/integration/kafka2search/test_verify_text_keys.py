"""``kafka2search verify`` and ``repair`` of tables keyed by text, against the real services
(both engines): keys of every kind of character — upper and lower case, accents, other
scripts, quotes, a backslash, an emoji, a key longer than the 256 characters a text
column's keyword held before — in two tables, one under the database's collation and one
under an ICU collation whose order is not code point order.

- The ICU table is refused until an index sorts its key ``COLLATE "C"`` (its report names
  the index to create; the other table is verified all the same).
- Both then verify equal from summaries alone, over several ranges.
- Differences made behind walcast's back (a document deleted — the long key —, one added,
  a row updated in Postgres with the slot moved past it) are found with their keys, and
  (on OpenSearch: repair's requests are the engines' same, test_repair.py runs them on
  both) repaired by snapshots of key ranges cut in code point order (pg2kafka reads them
  ``COLLATE "C"``), and the index then equals each table, compared by a plain read of
  both sides."""

from __future__ import annotations

import urllib.parse
from typing import Any

import psycopg
import pytest

from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.verify import repair, verify
from services.pg2kafka import admin
from tests.integration.conftest import Harness, HarnessFactory, keyed_source
from tests.integration.kafka2search.conftest import Indexer, IndexerFactory
from tests.integration.kafka2search.test_verify import past_the_snapshot

LONG = "x" * 300
KEYS = [
    *(f"k{i:03d}" for i in range(60)), *(f"K{i:03d}" for i in range(30)),
    *(f"\u00e9{i}" for i in range(15)), *(f"\u65e5\u672c{i}" for i in range(10)),
    " ", "a b", "o'quote", "back\\slash", "\U0001f600", "Zed", "zed", LONG,
]  # fmt: skip

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py


def pipeline(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, schema: str
) -> tuple[Harness, Indexer, Kafka2SearchSettings]:
    h = keyed_source(make_harness, schema)
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.t (k text PRIMARY KEY, v text, n int)")
    h.sql(f'CREATE TABLE {q}.u (k varchar(400) COLLATE "und-x-icu" PRIMARY KEY, v text, n int)')
    for table in ("t", "u"):
        with psycopg.connect(h.dsn, autocommit=True) as conn, conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {q}.{table} VALUES (%s, %s, %s)",
                [(k, f"v{i}", i) for i, k in enumerate(KEYS)],
            )
    admin.init(h.settings)
    h.start()
    pg = h.settings.postgres
    verify_section = {
        "postgres": {**pg.model_dump(), "password": pg.password.get_secret_value()},
        "slot": h.settings.replication.slot, "range_rows": 25, "mark_timeout_s": 60,
    }  # fmt: skip
    ix = make_indexer(h.settings.producer.topic, verify=verify_section).start()
    for table in ("t", "u"):
        ix.wait(lambda t=table: len(ix.docs_all(t, schema)) == len(KEYS), f"{table} indexed")
    past_the_snapshot(h, ix)
    return h, ix, ix.settings


def table_rows(h: Harness, schema: str, table: str) -> dict[str, tuple[Any, ...]]:
    return {r[0]: r for r in h.sql(f'SELECT k, v, n FROM "{schema}".{table}')}


def index_rows(ix: Indexer, schema: str, table: str) -> dict[str, tuple[Any, ...]]:
    docs = ix.docs_all(table, schema).values()
    return {d["k"]: (d["k"], d.get("v"), d.get("n")) for d in docs}


def doc_id(ix: Indexer, alias: str, key: str) -> str:
    hits = ix.es.request("POST", f"/{alias}/_search", body={"query": {"term": {"k.keyword": key}}})[
        "hits"
    ]["hits"]
    assert len(hits) == 1, (key[:40], hits)
    return str(hits[0]["_id"])


def test_text_keys_verify_and_repair_in_code_point_order(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,
    unique_name: str,
    engine_kind: str,
) -> None:
    schema = f"tk_{unique_name}"
    h, ix, settings = pipeline(make_harness, make_indexer, schema)
    refused, equal_t = verify(settings, [(schema, "u"), (schema, "t")])
    assert (refused.ok, equal_t.ok) == (False, True), (refused.as_dict(), equal_t.as_dict())
    assert "collation" in refused.refused
    assert f'CREATE INDEX CONCURRENTLY ON "{schema}"."u" ("k" COLLATE "C")' in refused.refused
    h.sql(f'CREATE INDEX ON "{schema}".u (k COLLATE "C")')

    equal = verify(settings, [(schema, "t"), (schema, "u")])
    for r in equal:
        assert r.ok, r.as_dict()
        assert (r.rows, r.looked_into) == (len(KEYS), 0), r.as_dict()
        assert r.ranges == len(KEYS) // 25 + 1

    # behind walcast's back
    alias_t, alias_u = ix.alias("t", schema), ix.alias("u", schema)
    gone = urllib.parse.quote(doc_id(ix, alias_t, LONG), safe="")
    ix.es.request("DELETE", f"/{alias_t}/_doc/{gone}", params={"refresh": "true"})
    ix.es.request(
        "PUT", f"/{alias_u}/_doc/Kz-intruder", body={"k": "Kz-intruder", "v": "x", "n": 0},
        params={"refresh": "true"},
    )  # fmt: skip
    h.stop()  # changes the slot is moved past: they never reach Kafka
    h.sql(f"UPDATE \"{schema}\".t SET v = 'bypassed' WHERE k = %s", ["\u00e93"])
    # "a b" follows "Zed" in code point order but precedes it under ICU: a range read in
    # the table's own order would be empty, and the sink would lose the row
    h.sql(f"UPDATE \"{schema}\".u SET v = 'bypassed' WHERE k = %s", ["a b"])
    h.sql(
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
        [h.settings.replication.slot],
    )
    h.start()

    found = {".".join(r.table): r for r in verify(settings, [(schema, "t"), (schema, "u")])}
    t, u = found[f"{schema}.t"], found[f"{schema}.u"]
    assert (t.missing, t.extra, t.differs) == ([(LONG,)], [], [("\u00e93",)]), t.as_dict()
    assert (u.missing, u.extra, u.differs) == ([], [("Kz-intruder",)], [("a b",)]), u.as_dict()
    if engine_kind != "opensearch":
        # The order of keywords is each engine's (above); repair's requests on them are
        # the same on both (tests/integration/kafka2search/test_repair.py runs them on
        # each), and its wait for the slot takes ~15 s a table: once is enough.
        return

    for report in repair(settings, [(schema, "t"), (schema, "u")]):
        assert report.ok, report.as_dict()
    for table in ("t", "u"):
        ix.wait(
            lambda t=table: index_rows(ix, schema, t) == table_rows(h, schema, t),
            f"the index of {table} equals the table",
        )
    for r in verify(settings, [(schema, "t"), (schema, "u")]):
        assert (r.ok, r.looked_into) == (True, 0), r.as_dict()
