"""``kafka2postgres verify`` / ``repair`` against real services: a target equal to its
source is verified while writers change the source; differences made behind walcast's
back — a row deleted, a row added and a value edited in the target, a source row updated
with the slot moved past it (never in Kafka) — are each reported with its key, for an
integer key and a text + integer key (compared by code point); ``repair`` has pg2kafka read
those key ranges again, the ranges' end marker removes the row the source does not hold,
and the target then equals the source by plain SQL."""

from __future__ import annotations

import json
import random
import threading

import psycopg
import pytest

from services.kafka2postgres.verify import repair, verify
from tests.integration.conftest import HarnessFactory, behind_the_slot
from tests.integration.kafka2postgres.conftest import ReplicaFactory, table_rows

pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py

ROWS = 400
KEYS = ["B", "a", "b", "é", "z", "Z"]  # code point order: B < Z < a < b < z < é


def test_a_target_is_verified_its_differences_found_and_repaired(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    h = make_harness(producer={"partition_key": "primary_key"})
    slot = h.settings.replication.slot
    t, c = f"vt_{slot[-8:]}", f"vc_{slot[-8:]}"
    h.start()
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n numeric(10,2))")
    h.sql(f"INSERT INTO {t} SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, {ROWS}) g")
    h.sql(f"CREATE TABLE {c} (a text, b int, v int, PRIMARY KEY (a, b))")
    for k in KEYS:
        h.sql(f"INSERT INTO {c} SELECT %s, g, g FROM generate_series(1, 30) g", [k])
    pg = h.settings.postgres
    r = make_replica(
        h.settings.producer.topic,
        verify={
            "postgres": {**pg.model_dump(), "password": pg.password.get_secret_value()},
            # rounds: a missing row is confirmed once every transaction of the server
            # older than the sink's read has ended; other tests' on the same server can
            # hold that back for a few rounds
            "slot": slot, "range_rows": 50, "mark_timeout_s": 60, "rounds": 8,
        },
    ).start()  # fmt: skip
    for q, key in ((f"public.{t}", "id"), (f"public.{c}", "(a, b)")):
        r.wait_equal(h.dsn, q, key)
    tables = [("public", t), ("public", c)]

    stop = threading.Event()
    written = [0]

    def writer() -> None:
        rng = random.Random(5)
        with psycopg.connect(h.dsn, autocommit=True) as conn:
            while not stop.is_set():
                k = rng.randint(1, ROWS + 50)
                conn.execute(
                    f"INSERT INTO {t} VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE"
                    " SET v = excluded.v, n = excluded.n",
                    [k, f"w{written[0]}", written[0] / 4],
                )
                written[0] += 1

    w = threading.Thread(target=writer, daemon=True)
    w.start()
    try:
        busy = verify(r.settings, tables)
    finally:
        stop.set()
        w.join(30)
    assert written[0] > 0
    assert all(rep.ok for rep in busy), [rep.as_dict() for rep in busy]
    quiet = verify(r.settings, tables)
    assert all(rep.ok for rep in quiet), [rep.as_dict() for rep in quiet]
    assert quiet[1].rows == len(KEYS) * 30

    # behind walcast's back: in the target, a row deleted, one added, a value edited; in
    # the source, a row updated with the slot moved past it
    r.sql(f"DELETE FROM public.{t} WHERE id = 7")
    r.sql(f"INSERT INTO public.{t} VALUES (9999, 'intruder', 1)")
    r.sql(f"UPDATE public.{t} SET v = 'edited' WHERE id = 11")
    r.sql(f"DELETE FROM public.{c} WHERE a = 'é' AND b = 3")
    r.sql(f"INSERT INTO public.{c} VALUES ('Y', 1, 1)")
    behind_the_slot(h, f"UPDATE {t} SET v = 'bypassed' WHERE id = 9")
    report, keyed = verify(r.settings, tables)
    d, e = report.as_dict(), keyed.as_dict()
    d["target_holds_7"] = r.sql(f"SELECT count(*) FROM public.{t} WHERE id = 7")[0][0]
    assert not report.ok
    assert not keyed.ok
    assert d["missing"] == {"count": 1, "sample": [7]}, json.dumps(d, default=str)
    assert d["extra"] == {"count": 1, "sample": [9999]}, d
    assert sorted(d["differs"]["sample"]) == [9, 11], d
    assert (e["missing"]["count"], e["extra"]["count"]) == (1, 1), e

    mended = repair(r.settings, tables)
    assert all(rep.ok for rep in mended), [rep.as_dict() for rep in mended]
    for q, key in ((f"public.{t}", "id"), (f"public.{c}", "(a, b)")):
        r.wait_equal(h.dsn, q, key)
    assert (
        table_rows(r.dsn, f"public.{t}", "id")["9"] == table_rows(h.dsn, f"public.{t}", "id")["9"]
    )
    again = verify(r.settings, tables)
    assert [(rep.ok, rep.looked_into) for rep in again] == [(True, 0), (True, 0)], [
        rep.as_dict() for rep in again
    ]
