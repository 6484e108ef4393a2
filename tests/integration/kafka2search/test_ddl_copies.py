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


def test_a_row_older_than_a_rename_met_after_it_lands_under_the_new_name(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    """Partition 0 renames ``note`` to ``remark``; partition 1's row, changed before the
    rename, comes after it: its value must land in ``remark`` (as the rename moved the
    documents already indexed), not bring ``note`` back."""
    topic = f"{unique_name}.cdc"
    t = "notes"
    ix = make_indexer(topic)
    ensure_topic(ix.settings.kafka.client_config(), topic, 2, 1)
    producer = Producer({"bootstrap.servers": ix.settings.kafka.bootstrap_servers})
    old_types = {"id": "int4", "v": "int4", "note": "text"}
    new_types = {"id": "int4", "v": "int4", "remark": "text"}
    add = _ddl(
        t, 50, [("id", "int4"), ("v", "int4"), ("note", "text")], "ALTER TABLE notes ADD note text"
    )
    rename = _ddl(t, 100, [("id", "int4"), ("v", "int4"), ("remark", "text")],
                  "ALTER TABLE notes RENAME note TO remark")  # fmt: skip

    def send(partition: int, *values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"notes", partition=partition)
        assert producer.flush(30) == 0

    send(0, add, _insert(t, 70, {"id": 1, "v": 70, "note": "one"}, old_types), rename,
         _insert(t, 150, {"id": 2, "v": 150, "remark": "two"}, new_types))  # fmt: skip
    ix.start()
    ix.wait(lambda: ix.docs(t).get("2", {}).get("remark") == "two", "partition 0 indexed")
    # Partition 1: a row changed before the rename, late; the DDL copies; a row after.
    send(1, add, _insert(t, 80, {"id": 3, "v": 80, "note": "three"}, old_types), rename,
         _insert(t, 160, {"id": 4, "v": 160, "remark": "four"}, new_types))  # fmt: skip
    ix.wait(lambda: "4" in ix.docs(t), "partition 1 indexed")
    assert ix.docs(t) == {
        "1": {"id": 1, "v": 70, "remark": "one"},
        "2": {"id": 2, "v": 150, "remark": "two"},
        "3": {"id": 3, "v": 80, "remark": "three"},
        "4": {"id": 4, "v": 160, "remark": "four"},
    }


def _delete(table: str, lsn: int, key: int, types: dict[str, str]) -> bytes:
    return orjson.dumps({
        "v": 1, "op": "delete", "db": "walcast", "schema": "public", "table": table,
        "lsn": lsn, "seq": 0, "commit_lsn": lsn, "xid": 3,
        "commit_ts": "2026-01-01T00:00:00.000000Z", "key": {"id": key}, "new": None,
        "old": {"id": key}, "types": types,
    })  # fmt: skip


def _read(table: str, lsn: int, row: dict[str, Any], types: dict[str, str]) -> bytes:
    return orjson.dumps({
        "v": 1, "op": "read", "db": "walcast", "schema": "public", "table": table,
        "lsn": lsn, "seq": 0, "commit_lsn": lsn, "xid": 0,
        "commit_ts": "2026-01-01T00:00:00.000000Z", "key": {"id": row["id"]}, "new": row,
        "old": None, "types": types, "snapshot": {"id": 9, "chunk": 0},
    })  # fmt: skip


def test_a_delete_older_than_a_drop_does_not_bring_the_column_back(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    """Seen in a composition run (seed 262534386): partition 0 drops ``dropme``; partition
    1, lagging, then brings a delete and snapshot read rows from before the drop. The
    delete's column types still name ``dropme``: they must not map it again — once
    mapped, every later read row kept the column as one "added again"."""
    topic = f"{unique_name}.cdc"
    t = "dropping"
    ix = make_indexer(topic)
    ensure_topic(ix.settings.kafka.client_config(), topic, 2, 1)
    producer = Producer({"bootstrap.servers": ix.settings.kafka.bootstrap_servers})
    old_types = {"id": "int4", "v": "int4", "dropme": "text"}
    new_types = {"id": "int4", "v": "int4"}
    add = _ddl(t, 50, [("id", "int4"), ("v", "int4"), ("dropme", "text")],
               "ALTER TABLE dropping ADD dropme text")  # fmt: skip
    drop = _ddl(t, 100, [("id", "int4"), ("v", "int4")], "ALTER TABLE dropping DROP dropme")

    def send(partition: int, *values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"dropping", partition=partition)
        assert producer.flush(30) == 0

    send(0, add, _insert(t, 60, {"id": 1, "v": 60, "dropme": "d1"}, old_types), drop,
         _insert(t, 150, {"id": 2, "v": 150}, new_types))  # fmt: skip
    ix.start()
    ix.wait(lambda: "2" in ix.docs(t), "partition 0 indexed")
    # Partition 1, late: a delete and two read rows from before the drop, the DDL copies,
    # and a row after them.
    send(1, add, _delete(t, 70, 9, old_types),
         _read(t, 65, {"id": 3, "v": 65, "dropme": "d3"}, old_types),
         _read(t, 65, {"id": 4, "v": 65, "dropme": "d4"}, old_types), drop,
         _insert(t, 160, {"id": 5, "v": 160}, new_types))  # fmt: skip
    ix.wait(lambda: "5" in ix.docs(t), "partition 1 indexed")
    assert ix.docs(t) == {
        "1": {"id": 1, "v": 60},
        "2": {"id": 2, "v": 150},
        "3": {"id": 3, "v": 65},
        "4": {"id": 4, "v": 65},
        "5": {"id": 5, "v": 160},
    }
