"""``verify`` and ``repair`` on a topic of walcast's events in Avro (``producer.encoding:
avro``, through the registry test double of tests/schema_registry.py): the markers are
found in the Avro records, an equal index is verified from summaries alone, a document
deleted behind walcast's back is reported missing, and ``repair`` — whose ``range_end``
marker travels in Avro too — brings it back."""

from __future__ import annotations

import pytest

from services.kafka2search.verify import repair, verify
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2search.conftest import IndexerFactory
from tests.integration.kafka2search.test_verify import past_the_snapshot
from tests.schema_registry import running

ROWS = 300

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py


@pytest.fixture
def engine_kind() -> str:
    """OpenSearch: finding markers is the engines' same Kafka code (the engines' requests
    run on both in test_verify.py and test_repair.py)."""
    return "opensearch"


def test_verify_and_repair_read_their_markers_in_avro(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    schema = f"va_{unique_name}"
    with running() as (url, _registry):
        h = make_harness(
            init=False,
            producer={"encoding": "avro", "partition_key": "primary_key"},
            schema_registry={"url": url, "subject_name_strategy": "topic_record"},
            filters={"include": [f"{schema}.*"]},
            snapshot={"mode": "initial", "workers": 1},
        )
        q = f'"{schema}"'
        h.sql(f"CREATE SCHEMA {q}")
        h.sql(f"CREATE TABLE {q}.t (id bigint PRIMARY KEY, v text, n numeric(8,2))")
        h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, {ROWS}) g")
        from services.pg2kafka import admin

        admin.init(h.settings)
        h.start()
        pg = h.settings.postgres
        ix = make_indexer(
            h.settings.producer.topic,
            schema_registry={"url": url},
            verify={
                "postgres": {**pg.model_dump(), "password": pg.password.get_secret_value()},
                "slot": h.settings.replication.slot, "range_rows": 100, "mark_timeout_s": 60,
            },
        ).start()  # fmt: skip
        ix.wait(lambda: len(ix.docs_all("t", schema)) == ROWS, "the index caught up")
        past_the_snapshot(h, ix)
        settings = ix.settings

        (equal,) = verify(settings, [(schema, "t")])
        assert equal.ok, equal.as_dict()
        assert (equal.rows, equal.looked_into) == (ROWS, 0)

        ix.es.request("DELETE", f"/{ix.alias('t', schema)}/_doc/42", params={"refresh": "true"})
        (fixed,) = repair(settings, [(schema, "t")])
        d = fixed.as_dict()
        assert fixed.ok, d
        assert d["found"]["missing"]["sample"] == [42], d
        assert d["repaired"]["missing"]["sample"] == [42], d
        ix.wait(lambda: "42" in ix.docs_all("t", schema), "row 42 back in the index")
