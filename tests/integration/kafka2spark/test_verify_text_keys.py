"""``kafka2spark verify`` and ``repair`` of a table keyed by text under an ICU collation
(whose order is not code point order), against the real services: the mirror's strings
and Postgres ``COLLATE "C"`` (by the index the error asks for) share one order, so the
table verifies equal from summaries alone; a Delta row deleted, one's key changed and a row
updated in Postgres with the slot moved past it are found with their keys and repaired
by snapshots of key ranges cut in code point order; the mirror then equals the table,
compared by a plain read of each side."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from services.kafka2spark.verify import repair, verify
from services.pg2kafka import admin
from tests.integration.conftest import Harness, HarnessFactory, keyed_source
from tests.integration.kafka2search.test_verify_text_keys import KEYS, LONG
from tests.integration.kafka2spark.conftest import MirrorFactory, verify_settings, wait_for
from tests.integration.kafka2spark.test_verify import Streaming

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py


def table_rows(h: Harness, schema: str) -> dict[str, tuple[Any, ...]]:
    return {r[0]: r for r in h.sql(f'SELECT k, v, n FROM "{schema}".u')}


def mirror_rows(path: Any) -> dict[str, tuple[Any, ...]]:
    if not any((path / "_delta_log").glob("*.json")):
        return {}
    t = DeltaTable(str(path)).to_pyarrow_table(columns=["k", "v", "n"]).to_pylist()
    return {r["k"]: (r["k"], r["v"], r["n"]) for r in t}


def test_kafka2spark_text_keys_verify_and_repair_in_code_point_order(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, unique_name: str
) -> None:
    schema = f"st_{unique_name}"
    h = keyed_source(make_harness, schema)
    q = f'"{schema}"'
    h.sql(f'CREATE TABLE {q}.u (k text COLLATE "und-x-icu" PRIMARY KEY, v text, n int)')
    with psycopg.connect(h.dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {q}.u VALUES (%s, %s, %s)", [(k, f"v{i}", i) for i, k in enumerate(KEYS)]
        )
    admin.init(h.settings)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    path = m.path("u", schema)
    streaming = Streaming(m).start()
    try:
        wait_for(lambda: len(mirror_rows(path)) == len(KEYS), "the mirror caught up", 300)
        settings = verify_settings(m, h.settings, range_rows=25)
        (refused,) = verify(settings, [(schema, "u")])
        assert not refused.ok
        assert 'COLLATE "C"' in refused.refused, refused.as_dict()
        h.sql(f'CREATE INDEX ON {q}.u (k COLLATE "C")')
        (equal,) = verify(settings, [(schema, "u")])
        assert equal.ok, equal.as_dict()
        assert (equal.rows, equal.looked_into) == (len(KEYS), 0), equal.as_dict()

        streaming.pause()
        DeltaTable(str(path)).delete(f"k = '{LONG}'")  # behind walcast's back
        DeltaTable(str(path)).update(predicate="k = 'Zed'", updates={"k": "'Kz-intruder'"})
        h.stop()
        # "a b" follows "Zed" in code point order but precedes it under ICU
        h.sql(f"UPDATE {q}.u SET v = 'bypassed' WHERE k = 'a b'")
        h.sql(
            "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
            [h.settings.replication.slot],
        )
        h.start()
        streaming.go.set()
        (report,) = repair(settings, [(schema, "u")])
        d = report.as_dict()
        assert report.ok, d
        found = d["found"]
        assert sorted(found["missing"]["sample"]) == ["Zed", LONG], found
        assert found["extra"]["sample"] == ["Kz-intruder"], found
        assert found["differs"]["sample"] == ["a b"], found
        wait_for(
            lambda: mirror_rows(path) == table_rows(h, schema), "the mirror equals the table", 300
        )
        (again,) = verify(settings, [(schema, "u")])
        assert (again.ok, again.looked_into) == (True, 0), again.as_dict()
    finally:
        streaming.stop()
    assert not streaming.errors, streaming.errors
