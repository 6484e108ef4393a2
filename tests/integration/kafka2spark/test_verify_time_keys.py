"""``kafka2spark verify`` of tables keyed by dates, timestamps (with and without time zone)
and ``char(n)``, against the real services: the mirror's dates and timestamps (read by
delta-rs) and blank-padded strings compare in Postgres's order, to the microsecond, over
ranges whose bounds fall inside one millisecond (the tables of
tests/integration/kafka2search/test_verify_time_keys.py). A table holding ``infinity``
in its key is not verified, and says why. A Delta row deleted, a Delta row updated by
another writer, and rows updated in Postgres with the slot moved past them are found with
their keys, as events write them, and repaired by snapshots of key ranges bounded by that
text (cast to the mirror's date and timestamp types): the mirror then equals each table,
compared by a plain read of both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from services.kafka2spark.verify import repair, verify
from services.pg2kafka import admin
from tests.integration.conftest import Harness, HarnessFactory, keyed_source
from tests.integration.kafka2search.test_verify_time_keys import KEYS, TABLES, time_key_tables
from tests.integration.kafka2spark.conftest import MirrorFactory, verify_settings, wait_for
from tests.integration.kafka2spark.test_verify import Streaming

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py


def mirror_count(path: Path) -> int:
    if not any((path / "_delta_log").glob("*.json")):
        return 0
    return DeltaTable(str(path)).to_pyarrow_table(columns=["v"]).num_rows


def table_rows(h: Harness, schema: str, table: str) -> set[tuple[Any, ...]]:
    cols = ", ".join((*KEYS[table], "v"))
    return {tuple(r) for r in h.sql(f'SELECT {cols} FROM "{schema}".{table}')}


def mirror_rows(path: Path, table: str) -> set[tuple[Any, ...]]:
    cols = [*KEYS[table], "v"]
    return {tuple(r[c] for c in cols) for r in DeltaTable(str(path)).to_pyarrow_table(
        columns=cols).to_pylist()}  # fmt: skip


def test_kafka2spark_time_and_char_keys_verify_to_the_microsecond(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, unique_name: str
) -> None:
    schema = f"stm_{unique_name}"
    h = keyed_source(make_harness, schema)
    time_key_tables(h, schema)
    admin.init(h.settings)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    streaming = Streaming(m).start()
    try:
        for table, n in {**TABLES, "far": 3}.items():
            path = m.path(table, schema)
            wait_for(lambda p=path, n=n: mirror_count(p) == n, f"the mirror of {table}", 300)
        settings = verify_settings(m, h.settings, range_rows=7)
        reports = {r.table[1]: r for r in verify(settings, [(schema, t) for t in (*TABLES, "far")])}
        far = reports.pop("far")
        assert not far.ok
        assert "years 1 to 9999" in far.refused, far.as_dict()
        for table, r in reports.items():
            assert r.ok, r.as_dict()
            assert (r.rows, r.looked_into) == (TABLES[table], 0), r.as_dict()

        streaming.pause()
        DeltaTable(str(m.path("ev", schema))).delete(
            "id = 2 AND at = '2026-11-28T15:00:00.500001Z'"
        )  # behind walcast's back
        DeltaTable(str(m.path("ts", schema))).update(
            predicate="at = '2026-11-28T15:00:00.000999'", updates={"v": "'edited'"}
        )
        h.stop()
        h.sql(f"UPDATE \"{schema}\".d SET v = 'bypassed' WHERE day = '0001-01-01'")
        h.sql(f"UPDATE \"{schema}\".c SET v = 'bypassed' WHERE code = 'abcd'")
        h.sql(
            "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
            [h.settings.replication.slot],
        )
        h.start()
        streaming.go.set()
        # repair verifies each table first: what that found is asserted below
        repaired = repair(settings, [(schema, t) for t in TABLES])
        found = {r.table[1]: r.found for r in repaired}
        for report in repaired:
            assert report.ok, report.as_dict()
        for table in TABLES:
            wait_for(
                lambda t=table: mirror_rows(m.path(t, schema), t) == table_rows(h, schema, t),
                f"the mirror of {table} equals the table",
                300,
            )
        for r in verify(settings, [(schema, t) for t in TABLES]):
            assert (r.ok, r.looked_into) == (True, 0), r.as_dict()
    finally:
        streaming.stop()
    assert not streaming.errors, streaming.errors
    ev, ts, d, c = found["ev"], found["ts"], found["d"], found["c"]
    assert (ev.missing, ev.extra, ev.differs) == (
        [(2, "2026-11-28T15:00:00.500001+00:00")],
        [],
        [],
    ), ev.as_dict()
    assert (ts.missing, ts.extra, ts.differs) == ([], [], [("2026-11-28T15:00:00.000999",)]), (
        ts.as_dict()
    )
    assert (d.missing, d.extra, d.differs) == ([], [], [("0001-01-01",)]), d.as_dict()
    assert (c.missing, c.extra, c.differs) == ([], [], [("abcd",)]), c.as_dict()
