"""The bad-input matrix through the whole pipeline (pg2kafka → Kafka → kafka2search and
kafka2spark, in-process): odd identifiers (spaces, quotes, dots, unicode, 63-byte names,
case twins), empty strings and NULLs, a partitioned table, a generated column, a table
without a key, a 1 MB and a 20 MB row. Each sink is compared with Postgres without
walcast's code (plain SQL, plain HTTP, ``deltalake``); what a sink cannot hold is named,
counted and kept out in a defined way — never a stop. (Every built-in type and an array of
each: ``tests/integration/test_type_walk.py``; SQL_ASCII text:
``tests/integration/pg2kafka/test_own_database.py``.)"""

from __future__ import annotations

import json
import random
import string
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from services.kafka2search.mapping import alias_name
from services.kafka2spark.names import postgres_name, table_dir
from tests.integration.conftest import Harness, HarnessFactory
from tests.integration.kafka2search.conftest import (  # noqa: F401 - fixtures
    IndexerFactory,
    engine_kind,
    make_indexer,
)
from tests.integration.kafka2spark.conftest import (  # noqa: F401 - fixtures
    MirrorFactory,
    make_mirror,
    spark,
)


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def text(n: int) -> str:
    return "".join(random.choices(string.ascii_letters, k=n))


def pg_rows(h: Harness, schema: str, table: str, key: str) -> dict[str, Any]:
    """Rows by key, without generated columns (pgoutput does not send them before
    Postgres 18, and DDL events leave them out: docs/events.md)."""
    rows = h.sql(
        f"SELECT {q(key)}, to_jsonb(x) - coalesce((SELECT array_agg(attname::text) FROM"
        f" pg_attribute WHERE attrelid = '{q(schema)}.{q(table)}'::regclass AND attgenerated"
        f" <> ''), '{{}}') FROM {q(schema)}.{q(table)} x"
    )
    return {str(k): v for k, v in rows}


def by_key(rows: dict[str, Any], key: str) -> dict[str, Any]:
    """Documents are addressed by the whole key (a JSON array for composite keys):
    compare by the first key column's value instead."""
    return {str(v[key]): v for v in rows.values()}


def search_rows(base: str, alias: str) -> dict[str, Any]:
    """The documents behind ``alias`` (plain HTTP); {} before the index exists, or while
    its shards are not yet searchable (503: just created, on a loaded machine)."""
    assert base.startswith("http")
    try:
        return _search(base, alias)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 503):
            return {}
        raise


def _search(base: str, alias: str) -> dict[str, Any]:
    url = f"{base}/{urllib.parse.quote(alias, safe='')}/_search"
    body = json.dumps(
        {"size": 100, "_source": {"excludes": ["_walcast_hash", "_walcast_xid", "_walcast_body"]}}
    ).encode()
    req = urllib.request.Request(  # noqa: S310
        url, data=body, headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
        hits = json.loads(resp.read())["hits"]["hits"]
    return {h["_id"]: h["_source"] for h in hits}


def test_the_bad_input_matrix_reaches_every_sink_or_is_named(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,  # noqa: F811
    make_mirror: MirrorFactory,  # noqa: F811
    engine_kind: str,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    stack_env: dict[str, str],
) -> None:
    if engine_kind != "opensearch":
        return  # one engine is enough here: both are walked by the type walk
    h = make_harness(producer={"partition_key": "primary_key"})
    s = f'Odd "Schema" {h.settings.replication.slot[-8:]}'
    long = ("t" * 55 + h.settings.replication.slot[-8:])[:63]  # a 63-byte name
    tables = {
        "Tåble with spaces.and dots": ("ID", 'CREATE TABLE {t} ("ID" int PRIMARY KEY,'
                                       ' "first name" text, "ünï" text, "a,b;c" text)'),
        long: ("id", "CREATE TABLE {t} (id int PRIMARY KEY, v text)"),
        "parted": ("id", "CREATE TABLE {t} (id int, day date, v text, PRIMARY KEY (id, day))"
                         " PARTITION BY RANGE (day)"),
        "generated": ("id", "CREATE TABLE {t} (id int PRIMARY KEY, a int,"
                            " b int GENERATED ALWAYS AS (a * 2) STORED)"),
        "big": ("id", "CREATE TABLE {t} (id int PRIMARY KEY, body text)"),
        "twins": ("id", 'CREATE TABLE {t} (id int PRIMARY KEY, "Name" text, name text)'),
        "nokey": ("", "CREATE TABLE {t} (v text)"),
    }  # fmt: skip
    h.sql(f"CREATE SCHEMA {q(s)}")
    for table, (_key, ddl) in tables.items():
        h.sql(ddl.format(t=f"{q(s)}.{q(table)}"))
    h.sql(f"CREATE TABLE {q(s)}.parted_2026 PARTITION OF {q(s)}.parted"
          " FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')")  # fmt: skip
    h.start()
    odd = f"{q(s)}.{q('Tåble with spaces.and dots')}"
    h.sql(f"""INSERT INTO {odd} VALUES (1, '', 'ö', NULL), (2, NULL, '', 'x')""")
    h.sql(f"INSERT INTO {q(s)}.{q(long)} VALUES (1, 'long name')")
    h.sql(f"INSERT INTO {q(s)}.parted VALUES (1, '2026-05-01', 'p')")
    h.sql(f"INSERT INTO {q(s)}.generated (id, a) VALUES (1, 21)")
    h.sql(f"INSERT INTO {q(s)}.big VALUES (1, %s), (2, %s)", [text(1_000_000), text(20_000_000)])
    h.sql(f"INSERT INTO {q(s)}.twins VALUES (1, 'A', 'a')")
    h.sql(f"INSERT INTO {q(s)}.nokey VALUES ('no key')")
    h.sql(f"INSERT INTO {q(s)}.generated (id, a) VALUES (2, 1)")  # the barrier: last

    def arrived(seen: list[dict[str, Any]], table: str, row_id: int) -> bool:
        return any(e.get("table") == table and e["key"].get("id") == row_id for e in seen)

    # Partitions by primary key: no order across tables, so wait for each last row.
    h.events(
        lambda seen: all(
            arrived(seen, table, row_id)
            for table, row_id in (("generated", 2), ("big", 1), ("big", 2))
        ),
        timeout=180,
    )

    # The 20 MB row is larger than the topic takes: a reference, the stream went on.
    big = [e for e in h.seen if e.get("table") == "big" and e["op"] == "insert"]
    assert sorted((e["key"]["id"], "oversized" in e) for e in big) == [(1, False), (2, True)]
    assert h.sql(f"SELECT count(*) FROM {q(s)}.nokey") == [(1,)]  # the app's table works
    # The keyless table streams as an insert-only table (filters.keyless_tables=inserts).
    nokey = [e for e in h.seen if e.get("table") == "nokey" and e["op"] != "ddl"]
    assert [(e["op"], e["new"], e.get("append_only")) for e in nokey] == [
        ("insert", {"v": "no key"}, True)
    ]

    ix = make_indexer(h.settings.producer.topic).start()
    m = make_mirror(h.settings.producer.topic)
    base = stack_env["WALCAST_OPENSEARCH_URL"]
    db = h.settings.postgres.database
    expected_missing = {"big": {"2"}}  # the reference: dead-lettered / quarantined
    for table, (key, _ddl) in tables.items():
        if not key:
            continue
        want = pg_rows(h, s, table, key)
        for gone in expected_missing.get(table, set()):
            want.pop(gone)
        # names as the sinks make them (sanitised, with a hash where they had to change)
        alias = alias_name(ix.settings.index.name_template, db, s, table)
        ix.wait(
            lambda alias=alias, want=want, key=key: (
                by_key(search_rows(base, alias), key).keys() == want.keys()
            ),
            f"the index of {table}",
            timeout=120,
        )
        assert by_key(search_rows(base, alias), key) == want, table
    letters = ix.dead_letters(1, timeout=10)
    assert any(b"larger than Kafka accepts" in d["headers"]["walcast-error"] for d in letters)

    m.run()
    results = m.results
    assert not any(r.held for r in results)  # every table, case twins too
    for table, (key, _ddl) in tables.items():
        if not key:
            continue
        want = pg_rows(h, s, table, key)
        for gone in expected_missing.get(table, set()):
            want.pop(gone)
        path = m.settings.delta.root / table_dir(m.settings.delta.table_template, db, s, table)
        rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        got = {}
        for r in rows:
            row = {postgres_name(k): v for k, v in r.items()
                   if k not in ("_walcast_lsn", "_walcast_hash", "_walcast_xid")}  # fmt: skip
            if "day" in row and row["day"] is not None:
                row["day"] = row["day"].isoformat()
            got[str(row[key])] = row
        assert got == want, table
