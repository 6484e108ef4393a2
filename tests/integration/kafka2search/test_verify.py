"""``kafka2search verify`` against the real services (pg2kafka streaming, kafka2search
indexing, both engines): an index equal to its table is verified from range summaries
alone; while writers keep updating and inserting rows it reports no difference (rows
changing are not differences); differences made behind walcast's back are each reported
with their key — a document deleted (missing), one added (extra), a row updated in
Postgres while the slot was moved past the update (differs), and, with ``--values``, a
value changed inside the engine through its own API (differs, edited in the sink)."""

from __future__ import annotations

import random
import threading

import psycopg

from services.kafka2search import admin as search_admin
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.verify import verify
from services.pg2kafka import admin
from shared.cli import with_values
from tests.integration.conftest import Harness, HarnessFactory, keyed_source
from tests.integration.kafka2search.conftest import Indexer, IndexerFactory

ROWS = 600


def pipeline(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,
    schema: str,
    interval_s: float = 0.0,
) -> tuple[Harness, Indexer, Kafka2SearchSettings]:
    """pg2kafka and kafka2search on a table of ROWS rows, the index caught up; the
    settings ``verify`` runs with."""
    h = keyed_source(make_harness, schema)
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.t (id int PRIMARY KEY, v text, n int, b bool)")
    h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g, g, g % 2 = 0 FROM generate_series(1, {ROWS}) g")
    admin.init(h.settings)
    h.start()
    pg = h.settings.postgres
    verify_section = {
        "postgres": {**pg.model_dump(), "password": pg.password.get_secret_value()},
        "slot": h.settings.replication.slot, "range_rows": 100, "mark_timeout_s": 60,
        "interval_s": interval_s,
    }  # fmt: skip
    ix = make_indexer(h.settings.producer.topic, verify=verify_section).start()
    ix.wait(lambda: len(ix.docs_all("t", schema)) == ROWS, "the index caught up")
    past_the_snapshot(h, ix)
    return h, ix, ix.settings


def past_the_snapshot(h: Harness, ix: Indexer) -> None:
    """Until the index applied the initial snapshot's end markers, which remove what the
    index held of each table before the snapshot: a document a test then adds behind
    walcast's back stays (on a loaded machine the rows are in before their end marker)."""
    slot = h.settings.replication.slot
    ix.wait(
        lambda: h.sql("SELECT bool_and(state = 'done') FROM _walcast.snapshots WHERE slot = %s",
                      [slot]) == [(True,)]
        and search_admin.status(ix.settings)["total_lag"] == 0,
        "the snapshot's end markers applied",
    )  # fmt: skip


def test_an_equal_index_is_verified_even_while_rows_change(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    schema = f"kv_{unique_name}"
    h, _ix, settings = pipeline(make_harness, make_indexer, schema)
    (quiet,) = verify(settings, [(schema, "t")])
    assert quiet.ok, quiet.as_dict()
    # six full ranges and the open one beyond the last key
    assert (quiet.rows, quiet.ranges, quiet.looked_into) == (ROWS, 7, 0)

    stop = threading.Event()
    written = [0]

    def writer() -> None:
        rng = random.Random(7)
        with psycopg.connect(h.dsn, autocommit=True) as conn:
            while not stop.is_set():
                k = rng.randint(1, ROWS + 200)
                conn.execute(
                    f'INSERT INTO "{schema}".t VALUES (%s, %s, %s, true) ON CONFLICT (id)'
                    " DO UPDATE SET v = excluded.v, n = excluded.n",
                    [k, f"w{written[0]}", written[0]],
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


def test_each_difference_made_behind_walcasts_back_is_reported_with_its_key(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str
) -> None:
    schema = f"kd_{unique_name}"
    h, ix, settings = pipeline(make_harness, make_indexer, schema)
    alias = ix.alias("t", schema)
    ix.es.request("DELETE", f"/{alias}/_doc/7", params={"refresh": "true"})
    ix.es.request(
        "PUT", f"/{alias}/_doc/{ROWS + 50}", body={"id": ROWS + 50, "v": "intruder"},
        params={"refresh": "true"},
    )  # fmt: skip
    # Values changed through the engine's API: the documents keep walcast's hash. One in a
    # range that differs anyway (its rows are read: seen), one in a range that is equal
    # by its hash sums (seen only when every document is read: verify.values).
    for k in (11, 450):
        ix.es.request(
            "POST", f"/{alias}/_update/{k}", body={"doc": {"v": "edited"}},
            params={"refresh": "true"},
        )  # fmt: skip
    # A row updated with the slot moved past the update: the change never reaches Kafka.
    h.stop()
    h.sql(f"UPDATE \"{schema}\".t SET v = 'bypassed' WHERE id = 9")
    h.sql(
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
        [h.settings.replication.slot],
    )
    h.start()
    (report,) = verify(settings, [(schema, "t")])
    d = report.as_dict()
    assert not report.ok
    assert d["missing"] == {"count": 1, "sample": [7]}, d
    assert d["extra"] == {"count": 1, "sample": [ROWS + 50]}, d
    assert d["differs"] == {"count": 2, "sample": [9, 11]}, d  # the hashes alone: no 450
    assert d["edited_in_sink"] == {"count": 1, "sample": [11]}, d
    assert d["unknown"]["count"] == 0, d

    (deep,) = verify(with_values(settings, True), [(schema, "t")])
    d = deep.as_dict()
    assert (d["missing"]["sample"], d["extra"]["sample"]) == ([7], [ROWS + 50]), d
    assert d["differs"] == {"count": 3, "sample": [9, 11, 450]}, d
    assert d["edited_in_sink"] == {"count": 2, "sample": [11, 450]}, d
