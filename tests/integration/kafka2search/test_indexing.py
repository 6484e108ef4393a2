"""kafka2search against real Kafka + OpenSearch and Elasticsearch, fed by pg2kafka from
real Postgres: the index equals the table after a mixed workload, DDL, truncate."""

from __future__ import annotations

import random
import string
from typing import Any

from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2search.conftest import IndexerFactory


def expected(h: Any, table: str) -> dict[str, dict[str, Any]]:
    """The table's rows as pg2kafka renders them (numeric as exact text), by id."""
    rows = h.sql(
        f"SELECT id, jsonb_build_object('id', id, 'name', name, 'price', price::text,"
        f" 'active', active, 'doc', doc, 'big', big) FROM {table}"
    )
    return {str(r[0]): r[1] for r in rows}


def big_text(n: int = 20000) -> str:
    return "".join(random.choices(string.ascii_letters, k=n))


def test_the_index_equals_the_table_after_a_mixed_workload(
    make_harness: HarnessFactory, make_indexer: IndexerFactory
) -> None:
    h = make_harness()
    table = f"k2s_{h.settings.replication.slot[-8:]}"
    h.sql(
        f"CREATE TABLE {table} (id int PRIMARY KEY, name text, price numeric(12,2),"
        " active bool, doc jsonb, big text)"
    )
    h.start()
    ix = make_indexer(h.settings.producer.topic).start()
    h.sql(
        f"INSERT INTO {table} SELECT g, 'n' || g, g * 1.25, g % 2 = 0, jsonb_build_object('g', g),"
        " NULL FROM generate_series(1, 300) g"
    )
    h.sql(f"UPDATE {table} SET big = %s WHERE id <= 5", [big_text()])
    h.sql(f"UPDATE {table} SET name = name || '!' WHERE id % 3 = 0")  # big unchanged: TOAST
    h.sql(f"DELETE FROM {table} WHERE id % 10 = 0")
    h.sql(f"UPDATE {table} SET id = id + 1000 WHERE id = 7")  # key change
    h.sql(f"UPDATE {table} SET price = 99.99, active = NOT active WHERE id BETWEEN 100 AND 150")
    want = expected(h, table)
    h.events(lambda seen: len(h.table_events(table)) >= 300 + 5 + 100 + 30 + 2 + 45)
    ix.wait(lambda: ix.docs(table) == want, "the index to equal the table", 90)
    assert ix.docs(table)["3"]["big"] == want["3"]["big"]  # kept through a TOAST-less update
    toast = [e for e in h.table_events(table) if e.get("unchanged_toast")]
    assert toast, "the workload should have produced updates with unchanged TOAST columns"
