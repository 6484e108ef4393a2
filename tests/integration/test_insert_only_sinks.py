"""Insert-only tables (no key, ``filters.keyless_tables: inserts``, the default) through
pg2kafka into both search engines: a history table's rows exactly once each (equal rows
too), a truncate empties it; a log table that later gains a primary key ends with exactly
its keyed rows — the appended documents of before the key are all removed by the
snapshot that follows, even when the slot's restart position lies below the key change
(an open transaction from before holds it there) and pg2kafka restarted in between.
Compared with plain SQL and plain HTTP."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from typing import Any

import psycopg

from services.pg2kafka import admin
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2search.conftest import (  # noqa: F401 - fixtures
    IndexerFactory,
    engine_kind,
    make_indexer,
)


def documents(url: str, alias: str) -> list[dict[str, Any]]:
    def call(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(url.rstrip("/") + path, method=method,  # noqa: S310
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - the stack's URL
            return json.loads(r.read() or b"{}")

    call("POST", f"/{alias}/_refresh")
    page = call(
        "POST",
        f"/{alias}/_search",
        {
            "size": 10000,
            "query": {"match_all": {}},
            "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]},
        },
    )
    return [h["_source"] for h in page["hits"]["hits"]]


def as_multiset(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True) for r in rows)


def test_insert_only_tables_reach_the_index_exactly_once_and_give_way_to_a_key(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,  # noqa: F811
    unique_name: str,
) -> None:
    schema = f"s_{unique_name}"
    h = make_harness(
        init=False,
        snapshot={"mode": "never", "automatic": True, "chunk_rows": 200},
        filters={"include": [f"{schema}.*"]},
        producer={"partition_key": "primary_key"},
    )
    h.sql(f'CREATE SCHEMA "{schema}"')
    admin.init(h.settings)
    h.start()
    ix = make_indexer(h.settings.producer.topic).start()
    url = ix.settings.engine.urls[0]

    def select(sql: str) -> list[dict[str, Any]]:
        return [r[0] for r in h.sql(sql)]

    # A history table: never a key. Equal rows, one COPY-like multi-row insert.
    h.sql(f'CREATE TABLE "{schema}".history (tid int, delta int, note text)')
    h.sql(f"""INSERT INTO "{schema}".history VALUES (1, 5, 'a'), (1, 5, 'a'), (2, -3, 'b')""")
    h.sql(f"""INSERT INTO "{schema}".history SELECT g % 7, g, 'x' FROM generate_series(1, 300) g""")
    # A log table that gains a key later, with an old transaction holding the slot's
    # restart position below the key change.
    h.sql(f'CREATE TABLE "{schema}".log (id int NOT NULL, v text)')
    h.sql(f"""INSERT INTO "{schema}".log SELECT g, 'before' FROM generate_series(1, 500) g""")
    with psycopg.connect(h.dsn, autocommit=True) as old:
        old.execute("BEGIN")
        old.execute("SELECT pg_current_xact_id()")
        ix.wait(lambda: len(documents(url, ix.alias("log", schema))) == 500
                if ix.es.resolve_alias(ix.alias("log", schema)) else False,
                "the appended log rows indexed", timeout=120)  # fmt: skip
        # pg2kafka restarted between the appends and the key: nothing in memory
        # remembers the table was insert-only; the DDL message says it joined.
        h.stop()
        h.start()
        h.sql(f'ALTER TABLE "{schema}".log ADD PRIMARY KEY (id)')
        h.sql(f"""UPDATE "{schema}".log SET v = 'after' WHERE id <= 50""")
        deadline = time.monotonic() + 180
        while (
            admin.snapshot_status(h.settings)[:1] == []
            or admin.snapshot_status(h.settings)[0]["state"] != "done"
        ):
            assert time.monotonic() < deadline, "the key's snapshot did not finish"
            time.sleep(0.5)
        old.execute("COMMIT")

    want_history = as_multiset(select(f'SELECT to_jsonb(t) FROM "{schema}".history t'))
    want_log = as_multiset(select(f'SELECT to_jsonb(t) FROM "{schema}".log t'))
    assert sum(want_history.values()) == 303
    deadline = time.monotonic() + 120
    while True:
        got_history = as_multiset(documents(url, ix.alias("history", schema)))
        got_log = as_multiset(documents(url, ix.alias("log", schema)))
        if (got_history, got_log) == (want_history, want_log):
            break
        assert time.monotonic() < deadline, (
            f"history: {sum(got_history.values())} documents for {sum(want_history.values())}"
            f" rows (extra {list((got_history - want_history).items())[:3]}, missing"
            f" {list((want_history - got_history).items())[:3]}); log: "
            f"{sum(got_log.values())} for {sum(want_log.values())}"
            f" (extra {list((got_log - want_log).items())[:3]})"
        )
        time.sleep(1)

    # A truncate empties the history's index.
    h.sql(f'TRUNCATE "{schema}".history')
    h.sql(f"""INSERT INTO "{schema}".history VALUES (9, 9, 'after the truncate')""")
    ix.wait(lambda: as_multiset(documents(url, ix.alias("history", schema)))
            == Counter([json.dumps({"tid": 9, "delta": 9, "note": "after the truncate"},
                                   sort_keys=True)]),
            "the history emptied by its truncate", timeout=120)  # fmt: skip
