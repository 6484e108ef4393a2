"""Events for the sinks' verify fields (tests/integration/kafka2search/test_verify_fields.py,
tests/integration/kafka2spark/test_verify_fields.py).

What every sink stores with a row for ``verify`` (docs/design.md#verification): the
row hash of the version it holds and the transaction that wrote it — on both search
engines (document fields, mapped, outside the row as readers see it with them excluded)
and in the Delta mirror (columns). The newest version's wins; a version whose hash is
unknown (an update that left a TOAST value out) is held without one, also after an older
full row filled its value in; a read row is written by transaction 0. Events crafted by
hand so that versions, hashes and transactions are chosen."""

from __future__ import annotations

import orjson
from confluent_kafka import Producer

from tests.integration.conftest import crafted_event, crafted_toast

T = "ledger"


def ev(
    op: str, lsn: int, row_id: int, xid: int, row_hash: int | None, toast: bool = False
) -> bytes:
    value = crafted_event(T, op, lsn, row_id)
    if toast:
        value = crafted_toast(value, None)
    out = orjson.loads(value)
    out["xid"] = xid
    if op == "read":
        out["snapshot"] = {"id": 1, "chunk": 0}
    if row_hash is not None:
        out["hash"] = row_hash
    return orjson.dumps(out)


EVENTS = [
    ev("insert", 100, 1, 501, 11),
    ev("update", 120, 1, 502, 12),  # the newest of row 1
    ev("read", 90, 2, 0, 21),  # a read row
    ev("insert", 100, 3, 503, 31),
    ev("update", 130, 3, 504, None, toast=True),  # its hash unknown
    ev("update", 140, 4, 505, None, toast=True),  # not held: unfilled, no hash
    ev("read", 95, 4, 0, 41),  # the older full row fills it: the hash stays unknown
]
# id -> (hash, xid) held: hash None = not stored
WANT = {1: (12, 502), 2: (21, 0), 3: (None, 504), 4: (None, 505)}


def produce(servers: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": servers})
    for value in EVENTS:
        producer.produce(topic, value, b"k")
    producer.flush(10)
