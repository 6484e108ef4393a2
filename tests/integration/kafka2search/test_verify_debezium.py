"""``kafka2search verify`` of an index fed pg2kafka's Debezium format (``input_format:
debezium``), in JSON and in Avro through the registry test double: the records carry the
row hash (``source.walcast_hash``) and the markers travel as ``m`` records on every
partition of the table's topic (docs/events.md). An index equal to its table is
verified while writers change it — money read as the format reads it, the rows an
unchanged TOAST value left of unknown hash named as such — and each
difference made behind walcast's back is reported with its key, then repaired: pg2kafka
reads the differing key ranges again as an incremental snapshot in this format (``r``
records, its end as an ``m`` record carrying the ranges), and the index then equals the
table."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import psycopg
import pytest

from services.kafka2search.verify import repair, verify
from services.pg2kafka import admin
from shared.kafka import ensure_topic
from tests.integration.conftest import HarnessFactory, behind_the_slot
from tests.integration.kafka2search.conftest import IndexerFactory
from tests.integration.kafka2search.test_verify import past_the_snapshot
from tests.schema_registry import running

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py

ROWS = 400
TOASTED = (3, 150, 333)  # rows with a value stored out of line


@pytest.fixture
def engine_kind() -> str:
    """OpenSearch: the engines' requests are the same as for walcast's format, run on both
    in test_verify.py; what differs here is how the records are read."""
    return "opensearch"


@contextmanager
def registry(encoding: str) -> Iterator[dict[str, Any]]:
    """The schema_registry section for ``encoding`` (a registry double for Avro)."""
    if encoding == "json":
        with nullcontext():
            yield {}
        return
    with running() as (url, _state):
        yield {"url": url}


@pytest.mark.parametrize("encoding", ["json", "avro"])
def test_an_index_of_debezium_records_is_verified_and_its_differences_found(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str, encoding: str
) -> None:
    schema = f"dv_{unique_name}"
    prefix = f"{unique_name}_p"
    q = f'"{schema}"'
    with registry(encoding) as reg:
        h = make_harness(
            init=False,
            producer={"format": "debezium", "encoding": encoding, "create_topic": True,
                      "topic_partitions": 3},
            debezium={"topic_prefix": prefix},
            schema_registry=reg,
            filters={"include": [f"{schema}.*"]},
            snapshot={"mode": "initial", "workers": 1},
        )  # fmt: skip
        h.sql(f"CREATE SCHEMA {q}")
        h.sql(f"CREATE TABLE {q}.t (id int PRIMARY KEY, v text, cash money, big text)")
        h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g, g * 1.25, NULL"
              f" FROM generate_series(1, {ROWS}) g")  # fmt: skip
        # ~13 kB of random text: compressed it still exceeds a page, so it is stored
        # out of line and an update that leaves it alone streams it as unchanged TOAST
        big = "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 400) g)"
        h.sql(f"UPDATE {q}.t SET big = {big} WHERE id IN {TOASTED}")
        topic = f"{prefix}.{schema}.t"
        ensure_topic(h.settings.kafka.client_config(), topic, 3, 1)  # the sink subscribes
        admin.init(h.settings)
        h.start()
        pg = h.settings.postgres
        ix = make_indexer(
            topic,
            consumer={"input_format": "debezium"},
            schema_registry=reg,
            verify={
                "postgres": {**pg.model_dump(), "password": pg.password.get_secret_value()},
                "slot": h.settings.replication.slot, "range_rows": 100, "mark_timeout_s": 60,
            },
        ).start()  # fmt: skip
        ix.wait(lambda: len(ix.docs_all("t", schema)) == ROWS, "the index caught up")
        past_the_snapshot(h, ix)
        settings = ix.settings

        # The TOASTed rows updated around their big value: of unknown hash in the index.
        h.sql(f"UPDATE {q}.t SET v = 'toast kept' WHERE id IN {TOASTED}")
        stop = threading.Event()
        written = [0]

        def writer() -> None:
            rng = random.Random(11)
            with psycopg.connect(h.dsn, autocommit=True) as conn:
                while not stop.is_set():
                    k = rng.randint(1, ROWS + 100)
                    conn.execute(
                        f"INSERT INTO {q}.t VALUES (%s, %s, %s::numeric::money) ON CONFLICT (id)"
                        " DO UPDATE SET v = excluded.v, cash = excluded.cash",
                        [k, f"w{written[0]}", written[0] / 4],
                    )
                    written[0] += 1

        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            (busy,) = verify(settings, [(schema, "t")])
        finally:
            stop.set()
            t.join(30)
        assert written[0] > 0
        assert busy.ok, busy.as_dict()

        (quiet,) = verify(settings, [(schema, "t")])
        d = quiet.as_dict()
        assert quiet.ok, d
        # every row compared by its hash but those the index holds without one: the rows
        # updated around their unchanged TOAST value, named (as in walcast's format)
        assert d["unknown"] == {"count": len(TOASTED), "sample": list(TOASTED)}, d
        assert (d["missing"]["count"], d["extra"]["count"], d["differs"]["count"]) == (0, 0, 0)

        alias = ix.alias("t", schema)
        ix.es.request("DELETE", f"/{alias}/_doc/7", params={"refresh": "true"})
        ix.es.request("PUT", f"/{alias}/_doc/{ROWS + 500}",
                      body={"id": ROWS + 500, "v": "intruder"},
                      params={"refresh": "true"})  # fmt: skip
        # a row updated with the slot moved past the update: never in Kafka
        behind_the_slot(h, f"UPDATE {q}.t SET v = 'bypassed' WHERE id = 9")
        (report,) = verify(settings, [(schema, "t")])
        d = report.as_dict()
        assert not report.ok
        assert d["missing"] == {"count": 1, "sample": [7]}, d
        assert d["extra"] == {"count": 1, "sample": [ROWS + 500]}, d
        assert d["differs"]["sample"] == [9], d

        # repaired through pg2kafka's incremental snapshot of those key ranges, written
        # in this format: r records, and its end as an m record with the ranges
        (mended,) = repair(settings, [(schema, "t")])
        assert mended.ok, mended.as_dict()
        ix.wait(
            lambda: (
                {(d["id"], d["v"]) for d in ix.docs_all("t", schema).values()}
                == set(h.sql(f"SELECT id, v FROM {q}.t"))
            ),
            "the index equals the table",
        )
        (again,) = verify(settings, [(schema, "t")])
        assert (again.ok, again.looked_into) == (True, 0), again.as_dict()
