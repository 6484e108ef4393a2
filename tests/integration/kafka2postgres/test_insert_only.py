"""Insert-only (keyless) tables into the target: pg2kafka streams a table without a key
as inserts and truncates (``filters.keyless_tables=inserts``); kafka2postgres holds each
row once under its row id (``_walcast_row_id``, last, the target's key), whatever the
redelivery. Compared with the source as multisets of rows (``to_jsonb`` without that
column) by plain SQL: two equal rows in the source are two rows in the target."""

from __future__ import annotations

from typing import Any

import pytest

from services.pg2kafka import admin
from tests.integration.conftest import HarnessFactory, difference
from tests.integration.kafka2postgres.conftest import ReplicaFactory, table_rows, table_schema
from tests.integration.kafka2postgres.test_replicate import _consumed, _ends

ROW_ID = "_walcast_row_id"


def rows(dsn: str, qualified: str) -> list[str]:
    """Every row as Postgres prints it, without the row id, sorted: a multiset."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        exists = c.execute("SELECT to_regclass(%s)", [qualified]).fetchone()
        if not exists or exists[0] is None:
            return []
        got = c.execute(f"SELECT (to_jsonb(t) - '{ROW_ID}')::text FROM {qualified} t").fetchall()
    return sorted(str(r[0]) for r in got)


def wait_same(h: Any, r: Any, qualified: str, what: str) -> None:
    r.wait(lambda: rows(r.dsn, qualified) == rows(h.dsn, qualified), what)


@pytest.mark.parametrize("partition_key", ["schema", "primary_key"])
def test_an_insert_only_table_is_appended_once_through_redelivery_ddl_truncate_and_a_key(
    make_harness: HarnessFactory, make_replica: ReplicaFactory, unique_name: str,
    partition_key: str,
) -> None:  # fmt: skip
    t = f"{unique_name}_log"
    q = f"public.{t}"
    h = make_harness(
        init=False, producer={"partition_key": partition_key},
        snapshot={"mode": "never", "automatic": True},
    )  # fmt: skip
    h.sql(f"CREATE TABLE {t} (a int NOT NULL, b text, at timestamptz)")
    admin.init(h.settings)
    h.start()
    # 100 rows in one statement (the bulk path), two equal rows, one row of NULLs
    h.sql(f"INSERT INTO {t} SELECT g, 'b' || g, '2024-01-01'::timestamptz + g * interval '1 s'"
          " FROM generate_series(1, 100) g")  # fmt: skip
    h.sql(f"INSERT INTO {t} VALUES (500, 'twin', NULL), (500, 'twin', NULL)")
    h.sql(f"INSERT INTO {t} (a) VALUES (501)")
    r = make_replica(h.settings.producer.topic).start()
    wait_same(h, r, q, "the insert-only rows in the target")
    assert len(rows(r.dsn, q)) == 103
    cols, key = table_schema(r.dsn, q)
    assert (cols[-1], key) == ((ROW_ID, "text"), [ROW_ID])
    assert cols[:-1] == table_schema(h.dsn, q)[0]

    # a column added, rows with it, a truncate: only what came after it stays
    h.sql(f"ALTER TABLE {t} ADD COLUMN c numeric(6,2)")
    h.sql(f"INSERT INTO {t} VALUES (600, 'with c', NULL, 1.5)")
    h.sql(f"TRUNCATE {t}")
    h.sql(f"INSERT INTO {t} SELECT g, 'after', NULL, g / 4.0 FROM generate_series(1000, 1079) g")
    wait_same(h, r, q, "the rows after the truncate")
    cols, _key = table_schema(r.dsn, q)
    assert sorted(c for c in cols if c[0] != ROW_ID) == sorted(table_schema(h.dsn, q)[0])

    # every record read again by a new group into the same target: nothing twice
    r.stop()
    again = make_replica(
        h.settings.producer.topic, consumer={"group_id": f"{r.settings.consumer.group_id}-2"}
    ).start()
    end = sum(_ends(h))
    again.wait(lambda: _consumed(again) >= end, "the second group to read the whole topic")
    wait_same(h, again, q, "the target after every record came again")
    assert len(rows(again.dsn, q)) == 80

    # the table gains a key: its rows go, pg2kafka's snapshot of it brings them keyed
    h.sql(f"ALTER TABLE {t} ADD PRIMARY KEY (a)")
    h.sql(f"UPDATE {t} SET b = 'keyed' WHERE a = 1001")
    again.wait(
        lambda: table_rows(again.dsn, q, "a") == table_rows(h.dsn, q, "a"),
        "the keyed table equal to the source",
        timeout=180,
    )
    assert table_schema(again.dsn, q) == table_schema(h.dsn, q)
    want, got = table_rows(h.dsn, q, "a"), table_rows(again.dsn, q, "a")
    assert difference(want, got) == ([], [], [])
