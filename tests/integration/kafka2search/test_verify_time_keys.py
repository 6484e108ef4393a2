"""``kafka2search verify`` of tables keyed by dates, timestamps (with and without time zone)
and ``char(n)``, against the real services (both engines). A ``date`` field keeps
milliseconds; the keys here differ by single microseconds within one millisecond, span
the years 1 to 9999, and sit on both sides of 1970, with ranges small enough that their
bounds fall inside such clusters.

- Every table verifies equal from summaries alone (no range's rows read), over many
  ranges: the index compares each key by its text (``<column>.key``), as Postgres orders it.
- A table holding ``infinity`` in its key is not verified, and says why.
- Differences made behind walcast's back — a document deleted (a key one microsecond from
  another), one added (a key between two others in the same millisecond), rows updated in
  Postgres with the slot moved past them — are found with their keys, as events write
  them — and, on OpenSearch (repair's requests are the engines' same), repaired by
  snapshots of key ranges bounded by that text: the index then equals each table,
  compared by a plain read of both sides."""

from __future__ import annotations

import urllib.parse
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
import pytest

from services.kafka2search.verify import repair, verify
from services.pg2kafka import admin
from shared.verify.repair import RepairReport
from tests.integration.conftest import Harness, HarnessFactory, keyed_source
from tests.integration.kafka2search.conftest import Indexer, IndexerFactory
from tests.integration.kafka2search.test_verify import past_the_snapshot

BASE = datetime(2026, 11, 28, 15, 0, 0, tzinfo=UTC)
MICROS = [0, 1, 999, 1000, 1001, 500000, 500001, 510000, 999999]
TIMES = [
    *(BASE + timedelta(seconds=s, microseconds=u) for s in (0, 1, 3600) for u in MICROS),
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]
DAYS = [date(1, 1, 1), date(1969, 12, 31), date(1970, 1, 1), date(9999, 12, 31),
        *(date(2026, 1, 1) + timedelta(days=37 * i) for i in range(16))]  # fmt: skip
CODES = ["a", "ab", "abc", "abcd", "a b", "A", "Z", "z", "\u00e9", "\u65e5\u672c", " ", "0",
         "9", "a!", "b"]  # fmt: skip
pytestmark = pytest.mark.usefixtures("slots_move_often")  # repairs: tests/conftest.py

TABLES = {"ev": 2 * len(TIMES), "ts": len(TIMES), "d": len(DAYS), "c": len(CODES)}


def time_key_tables(h: Harness, schema: str) -> None:
    """The tables (``far`` holds ``infinity``), created and filled."""
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.ev (id int, at timestamptz, v text, PRIMARY KEY (id, at))")
    h.sql(f"CREATE TABLE {q}.ts (at timestamp PRIMARY KEY, v text)")
    h.sql(f"CREATE TABLE {q}.d (day date PRIMARY KEY, v text)")
    h.sql(f"CREATE TABLE {q}.c (code char(4) PRIMARY KEY, v text)")
    h.sql(f"CREATE TABLE {q}.far (at timestamptz PRIMARY KEY, v text)")
    with psycopg.connect(h.dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {q}.ev VALUES (%s, %s, %s)",
            [(i, t, f"v{n}") for i in (1, 2) for n, t in enumerate(TIMES)],
        )
        cur.executemany(
            f"INSERT INTO {q}.ts VALUES (%s, %s)",
            [(t.replace(tzinfo=None), f"v{n}") for n, t in enumerate(TIMES)],
        )
        cur.executemany(f"INSERT INTO {q}.d VALUES (%s, %s)", [(d, "v") for d in DAYS])
        cur.executemany(f"INSERT INTO {q}.c VALUES (%s, %s)", [(c, "v") for c in CODES])
        cur.execute(
            f"INSERT INTO {q}.far VALUES ('infinity', 'a'), ('-infinity', 'b'), ('2020-01-01', 'c')"
        )


def pipeline(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, schema: str
) -> tuple[Harness, Indexer]:
    h = keyed_source(make_harness, schema)
    time_key_tables(h, schema)
    admin.init(h.settings)
    h.start()
    pg = h.settings.postgres
    verify_section = {
        "postgres": {**pg.model_dump(), "password": pg.password.get_secret_value()},
        "slot": h.settings.replication.slot, "range_rows": 7, "mark_timeout_s": 60,
    }  # fmt: skip
    ix = make_indexer(h.settings.producer.topic, verify=verify_section).start()
    for table, n in {**TABLES, "far": 3}.items():
        ix.wait(lambda t=table, n=n: len(ix.docs_all(t, schema)) == n, f"{table} indexed")
    past_the_snapshot(h, ix)
    return h, ix


KEYS = {"ev": ("id", "at"), "ts": ("at",), "d": ("day",), "c": ("code",)}


def _time(v: Any) -> Any:
    """A value as Python compares it: a date or timestamp's text parsed (no walcast code)."""
    if isinstance(v, str) and len(v) >= 10 and v[4] == "-" and v[:4].isdigit():
        return datetime.fromisoformat(v) if "T" in v else date.fromisoformat(v)
    return v


def table_rows(h: Harness, schema: str, table: str) -> set[tuple[Any, ...]]:
    cols = ", ".join((*KEYS[table], "v"))
    return {tuple(r) for r in h.sql(f'SELECT {cols} FROM "{schema}".{table}')}


def index_rows(ix: Indexer, schema: str, table: str) -> set[tuple[Any, ...]]:
    return {
        tuple(_time(d.get(c)) for c in (*KEYS[table], "v"))
        for d in ix.docs_all(table, schema).values()
    }


def one_id(ix: Indexer, alias: str, query: dict[str, object]) -> str:
    hits = ix.es.request("POST", f"/{alias}/_search", body={"query": query})["hits"]["hits"]
    assert len(hits) == 1, (query, hits)
    return urllib.parse.quote(str(hits[0]["_id"]), safe="")


def test_time_and_char_keys_verify_to_the_microsecond(
    make_harness: HarnessFactory, make_indexer: IndexerFactory, unique_name: str, engine_kind: str
) -> None:
    schema = f"tmk_{unique_name}"
    h, ix = pipeline(make_harness, make_indexer, schema)
    settings = ix.settings
    names = [(schema, t) for t in (*TABLES, "far")]
    reports = {r.table[1]: r for r in verify(settings, names)}
    far = reports.pop("far")
    assert not far.ok
    assert "years 1 to 9999" in far.refused, far.as_dict()
    for table, r in reports.items():
        assert r.ok, r.as_dict()
        assert (r.rows, r.looked_into) == (TABLES[table], 0), r.as_dict()
        assert r.ranges == TABLES[table] // 7 + 1, r.as_dict()

    # behind walcast's back
    gone_text = "2026-11-28T15:00:00.500001+00:00"
    alias_ev, alias_ts = ix.alias("ev", schema), ix.alias("ts", schema)
    doc = one_id(ix, alias_ev, {"bool": {"filter": [{"term": {"id": 2}},
                                                    {"term": {"at.key": gone_text}}]}})  # fmt: skip
    ix.es.request("DELETE", f"/{alias_ev}/_doc/{doc}", params={"refresh": "true"})
    between = "2026-11-28T15:00:00.0005"  # between .000001 and .000999, in one millisecond
    ix.es.request(
        "PUT", f"/{alias_ts}/_doc/intruder", body={"at": between, "v": "x"},
        params={"refresh": "true"},
    )  # fmt: skip
    h.stop()  # changes the slot is moved past: they never reach Kafka
    h.sql(f"UPDATE \"{schema}\".d SET v = 'bypassed' WHERE day = '1969-12-31'")
    h.sql(f"UPDATE \"{schema}\".c SET v = 'bypassed' WHERE code = 'a b'")
    h.sql(
        f"UPDATE \"{schema}\".ev SET v = 'bypassed' WHERE id = 1 AND at = %s",
        [BASE + timedelta(seconds=1, microseconds=1000)],
    )
    h.sql(
        "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
        [h.settings.replication.slot],
    )
    h.start()

    repaired: list[RepairReport] = []
    if engine_kind == "opensearch":  # repair verifies each table first: its finding is found
        repaired = repair(settings, [(schema, t) for t in TABLES])
        found = {r.table[1]: r.found for r in repaired}
    else:
        found = {r.table[1]: r for r in verify(settings, [(schema, t) for t in TABLES])}
    ev, ts, d, c = found["ev"], found["ts"], found["d"], found["c"]
    assert (ev.missing, ev.extra) == ([(2, gone_text)], []), ev.as_dict()
    assert ev.differs == [(1, "2026-11-28T15:00:01.001+00:00")], ev.as_dict()
    assert (ts.missing, ts.extra, ts.differs) == ([], [(between,)], []), ts.as_dict()
    assert (d.missing, d.extra, d.differs) == ([], [], [("1969-12-31",)]), d.as_dict()
    assert (c.missing, c.extra, c.differs) == ([], [], [("a b ",)]), c.as_dict()
    if engine_kind != "opensearch":
        return

    for report in repaired:
        assert report.ok, report.as_dict()
    for table in TABLES:
        ix.wait(
            lambda t=table: index_rows(ix, schema, t) == table_rows(h, schema, t),
            f"the index of {table} equals the table",
        )
    for r in verify(settings, [(schema, t) for t in TABLES]):
        assert (r.ok, r.looked_into) == (True, 0), r.as_dict()
