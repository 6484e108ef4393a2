"""``kafka2spark verify`` of a mirror fed pg2kafka's Debezium format (``input_format:
debezium``; the records carry ``source.walcast_hash``, the markers are ``m`` records on
every partition): an equal mirror is verified from range summaries alone, and a Delta row
deleted behind walcast's back and a row updated in Postgres with the slot moved past it
are reported with their keys, then repaired through pg2kafka's incremental snapshot of
their key ranges in this format. (Both encodings and the engines: the kafka2search test of
the same name; how the records are read is shared.)"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from services.kafka2spark.verify import repair, verify
from services.pg2kafka import admin
from shared.kafka import ensure_topic
from tests.integration.conftest import HarnessFactory, behind_the_slot
from tests.integration.kafka2spark.conftest import MirrorFactory, verify_settings, wait_for
from tests.integration.kafka2spark.test_verify import Streaming

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py

ROWS = 300


def test_a_mirror_of_debezium_records_is_verified_and_its_differences_found(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, unique_name: str
) -> None:
    schema = f"sd_{unique_name}"
    prefix = f"{unique_name}_p"
    q = f'"{schema}"'
    h = make_harness(
        init=False,
        producer={"format": "debezium", "create_topic": True, "topic_partitions": 2},
        debezium={"topic_prefix": prefix},
        filters={"include": [f"{schema}.*"]},
        snapshot={"mode": "initial", "workers": 1},
    )
    h.sql(f"CREATE SCHEMA {q}")
    h.sql(f"CREATE TABLE {q}.t (id int PRIMARY KEY, v text, n numeric(8,2))")
    h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, {ROWS}) g")
    topic = f"{prefix}.{schema}.t"
    ensure_topic(h.settings.kafka.client_config(), topic, 2, 1)
    admin.init(h.settings)
    h.start()
    m = make_mirror(topic)
    s = m.settings
    m.settings = s.model_copy(
        update={"source": s.source.model_copy(update={"input_format": "debezium"})}
    )
    path = m.path("t", schema)
    streaming = Streaming(m).start()
    try:
        wait_for(
            lambda: (
                any((path / "_delta_log").glob("*.json"))
                and DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).num_rows == ROWS
            ),
            "the mirror caught up",
            300,
        )
        h.sql(f"UPDATE {q}.t SET n = n + 1 WHERE id % 50 = 0")  # changes after the snapshot
        settings = verify_settings(m, h.settings, range_rows=100)
        (equal,) = verify(settings, [(schema, "t")])
        assert equal.ok, equal.as_dict()
        assert (equal.rows, equal.looked_into) == (ROWS, 0), equal.as_dict()

        streaming.pause()
        DeltaTable(str(path)).delete("id = 7")  # behind walcast's back
        DeltaTable(str(path)).update(predicate="id = 11", updates={"id": str(ROWS + 50)})
        behind_the_slot(h, f"UPDATE {q}.t SET v = 'bypassed' WHERE id = 9")
        streaming.go.set()
        (report,) = verify(settings, [(schema, "t")])
        d = report.as_dict()
        assert not report.ok
        assert d["missing"] == {"count": 2, "sample": [7, 11]}, d
        assert d["extra"] == {"count": 1, "sample": [ROWS + 50]}, d
        assert d["differs"] == {"count": 1, "sample": [9]}, d
        assert d["unknown"]["count"] == 0, d

        # repaired through pg2kafka's incremental snapshot of those key ranges in this
        # format (r records; its end an m record carrying the ranges)
        (mended,) = repair(settings, [(schema, "t")])
        assert mended.ok, mended.as_dict()

        def mirror() -> set[tuple[object, ...]]:
            rows = DeltaTable(str(path)).to_pyarrow_table(columns=["id", "v"]).to_pylist()
            return {(r["id"], r["v"]) for r in rows}

        wait_for(lambda: mirror() == set(h.sql(f"SELECT id, v FROM {q}.t")),
                 "the mirror equals the table", 300)  # fmt: skip
        (again,) = verify(settings, [(schema, "t")])
        assert (again.ok, again.looked_into) == (True, 0), again.as_dict()
    finally:
        streaming.stop()
    assert not streaming.errors, streaming.errors
