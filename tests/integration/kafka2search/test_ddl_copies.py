"""Copies of schema changes met out of order, on both engines. Under primary-key
partitioning every partition carries a copy of each DDL event; here partition 0's
changes (a column added, a row written with it) are indexed before partition 1's late
copies arrive. The late copy of the older schema — without the column — must not clear
the column's values. Events crafted by hand (the partitions and versions chosen), the
index read back over HTTP."""

from __future__ import annotations

from typing import Any

import orjson
from confluent_kafka import Producer

from shared.kafka import ensure_topic
from tests.integration.kafka2search.conftest import IndexerFactory


def _ddl(table: str, lsn: int, columns: list[tuple[str, str]], statement: str) -> bytes:
    return orjson.dumps({
        "v": 1, "op": "ddl", "db": "walcast", "schema": "public", "table": table,
        "lsn": lsn, "seq": 0, "commit_lsn": lsn, "xid": 1,
        "commit_ts": "2026-01-01T00:00:00.000000Z", "key": {}, "new": None, "old": None,
        "ddl": {"tag": "ALTER TABLE", "statement": statement, "primary_key": ["id"],
                "columns": [{"name": n, "type": t, "num": i + 1}
                            for i, (n, t) in enumerate(columns)]},
    })  # fmt: skip


def _insert(table: str, lsn: int, row: dict[str, Any], types: dict[str, str]) -> bytes:
    return orjson.dumps({
        "v": 1, "op": "insert", "db": "walcast", "schema": "public", "table": table,
        "lsn": lsn, "seq": 0, "commit_lsn": lsn, "xid": 2,
        "commit_ts": "2026-01-01T00:00:00.000000Z", "key": {"id": row["id"]}, "new": row,
        "old": None, "types": types,
    })  # fmt: skip


def test_a_late_copy_of_an_older_schema_keeps_the_newer_columns_values(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.cdc"
    t = "accounts"
    ix = make_indexer(topic)
    ensure_topic(ix.settings.kafka.client_config(), topic, 2, 1)
    producer = Producer({"bootstrap.servers": ix.settings.kafka.bootstrap_servers})
    before = [("id", "int4"), ("v", "int4")]
    after = [*before, ("extra", "text")]
    types = {"id": "int4", "v": "int4", "extra": "text"}
    create = _ddl(t, 50, before, "ALTER TABLE accounts ADD v int4")
    add = _ddl(t, 100, after, "ALTER TABLE accounts ADD extra text")

    def send(partition: int, *values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"accounts", partition=partition)
        assert producer.flush(30) == 0

    send(0, create, add, _insert(t, 150, {"id": 1, "v": 150, "extra": "kept"}, types))
    ix.start()
    ix.wait(lambda: ix.docs(t).get("1", {}).get("extra") == "kept", "row 1 indexed")
    # Partition 1's copies, late; then a row after them (so: they were applied).
    send(1, create, add, _insert(t, 160, {"id": 2, "v": 160, "extra": "two"}, types))
    ix.wait(lambda: "2" in ix.docs(t), "row 2 indexed")
    assert ix.docs(t) == {
        "1": {"id": 1, "v": 150, "extra": "kept"},
        "2": {"id": 2, "v": 160, "extra": "two"},
    }
