"""A snapshot chunk's records (services/pg2kafka/snapshots/rows.py) and the one rule for
a record too large for its topic (services/pg2kafka/output.py ``Oversized``): the fast
path (Postgres writes the JSON) and the built path write the same event for the same row,
under every partition key; both number the rows of a chunk from 0; a row too large for
the topic travels as the same reference either way, counted and logged; a format without
references stops with what to fix."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder
from services.pg2kafka.output import JsonValues, Oversized, reference
from services.pg2kafka.routing import Routing
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.snapshots.rows import ChunkRows, WalcastReads
from services.pg2kafka.topics import StreamTarget
from services.pg2kafka.types import TypeRegistry
from shared.contract.rowhash import row_hash
from shared.errors import PermanentError
from shared.settings import load_settings

USERS = pg.Relation(16384, "app", "users", "d", (pg.Column("id", 23, -1, True),
                                                 pg.Column("name", 25, -1, False)))  # fmt: skip
LOG = pg.Relation(16385, "app", "log", "d", (pg.Column("line", 25, -1, False),))


def _with_hash(rel: pg.Relation, rows: list[Any]) -> list[Any]:
    """Each fast row with the row hash Postgres computes for it (the SQL and the reference
    agree: tests/integration/pg2kafka/test_row_hash.py)."""
    names = [c.name for c in rel.columns]
    return [(text, (*js, str(row_hash(zip(names, text, strict=True))))) for text, js in rows]


# (columns' text as COPY writes them, (key and row as Postgres writes their JSON, row hash))
USERS_ROWS = _with_hash(USERS, [
    (("1", "ann"), ('{"id":1}', '{"id":1,"name":"ann"}')),
    (("2", None), ('{"id":2}', '{"id":2,"name":null}')),
    (("3", 'say "hi"'), ('{"id":3}', '{"id":3,"name":"say \\"hi\\""}')),
])  # fmt: skip
LOG_ROWS = _with_hash(LOG, [
    (("one",), (None, '{"line":"one"}')),
    (("two",), (None, '{"line":"two"}')),
])  # fmt: skip


def reads(mode: str, counted: list[int] | None = None) -> WalcastReads:
    s = load_settings(
        Pg2KafkaSettings, env_file=None, http={"enabled": False}, producer={"partition_key": mode}
    )
    builder = EventBuilder("db1", TypeRegistry())
    for rel in (USERS, LOG):
        builder.relation(rel)
    values = JsonValues()
    sink = counted if counted is not None else []
    return WalcastReads(
        "db1", builder, values, Routing(s, StreamTarget.cdc(s), lambda _topic: 6),
        Oversized(values, lambda: sink.append(1)),
    )  # fmt: skip


def chunk(
    made: WalcastReads, rel: pg.Relation, limit: int = 1_000_000, epoch: int = 0
) -> ChunkRows:
    return ChunkRows(rel, made.json_columns(rel), 900, "2026-11-27T10:00:00.000000Z",
                     {"id": 4, "chunk": 2}, epoch, made.topic(rel), limit)  # fmt: skip


class Producer:
    """confluent_kafka.Producer's ``produce`` as the snapshot's sink calls it: full
    (BufferError) on the calls numbered in ``full``."""

    def __init__(self, full: set[int]) -> None:
        self.full = full
        self.calls = 0
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None) -> None:
        self.calls += 1
        if self.calls in self.full:
            raise BufferError("Local: Queue full")
        self.sent.append((topic, value, key))


class Sink:
    """shared.kafka.BulkKafkaSink as a chunk's sending uses it: its producer, and
    ``write``, which waits for room (here: takes the record)."""

    def __init__(self, full: set[int] | None = None) -> None:
        self.producer = Producer(full or set())
        self.waited = 0

    def write(self, topic: str, value: bytes, key: bytes | None) -> None:
        self.waited += 1
        self.producer.sent.append((topic, value, key))


def sent(
    made: WalcastReads,
    at: ChunkRows,
    rows: list[Any],
    every: int = 1000,
    full: set[int] | None = None,
) -> tuple[list[tuple[bytes, bytes | None]], list[int], Sink]:
    """What the chunk's sending handed to Kafka, what it yielded, and the sink."""
    sink = Sink(full)
    send = made._fast(at) if at.json_columns else made._built(at)
    yields = list(send(iter(rows), sink, every))  # type: ignore[arg-type]
    assert all(topic == at.topic for topic, _, _ in sink.producer.sent)
    return [(v, k) for _, v, k in sink.producer.sent], yields, sink


def both(
    made: WalcastReads, rel: pg.Relation, rows: list[Any], at: ChunkRows
) -> tuple[list[tuple[bytes, bytes | None]], list[tuple[bytes, bytes | None]]]:
    """The chunk's records by the fast path and by the builder."""
    fast, _, _ = sent(made, replace(at, json_columns=True), [r[1] for r in rows])
    built, _, _ = sent(made, replace(at, json_columns=False), [r[0] for r in rows])
    return fast, built


@pytest.mark.parametrize("mode", ["schema", "table", "primary_key"])
@pytest.mark.parametrize("epoch", [0, 3])
@pytest.mark.parametrize(("rel", "rows"), [(USERS, USERS_ROWS), (LOG, LOG_ROWS)],
                         ids=["keyed", "insert-only"])  # fmt: skip
def test_the_fast_path_writes_the_event_the_builder_writes(
    mode: str, epoch: int, rel: pg.Relation, rows: list[Any]
) -> None:
    made = reads(mode)
    assert made.json_columns(rel)
    fast, built = both(made, rel, rows, chunk(made, rel, epoch=epoch))
    assert [k for _, k in fast] == [k for _, k in built]
    assert [orjson.loads(v) for v, _ in fast] == [orjson.loads(v) for v, _ in built]
    events = [orjson.loads(v) for v, _ in fast]
    assert [e["seq"] for e in events] == list(range(len(rows)))  # numbered from 0
    assert all(e["op"] == "read" and e["lsn"] == 900 for e in events)
    assert all(e.get("epoch", 0) == epoch for e in events)
    assert all(e.get("append_only", False) is (rel is LOG) for e in events)


def test_a_row_too_large_travels_as_the_same_reference_either_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counted: list[int] = []
    made = reads("primary_key", counted)
    big = (("2", "x" * 500), ('{"id":2}', '{"id":2,"name":"%s"}' % ("x" * 500)))
    rows = [USERS_ROWS[0], *_with_hash(USERS, [big])]
    with caplog.at_level(logging.WARNING):
        fast, built = both(made, USERS, rows, chunk(made, USERS, limit=400))
    assert fast == built
    assert "oversized" not in orjson.loads(fast[0][0])
    ref = orjson.loads(fast[1][0])
    assert ref["new"] is None
    assert ref["key"] == {"id": 2}
    assert ref["seq"] == 1
    assert ref["oversized"] > 500
    assert counted == [1, 1]  # each path counted its one
    assert "more than topic" in caplog.text
    assert "app.users" in caplog.text


def test_the_reference_is_the_events_without_its_rows() -> None:
    ev = {"v": 1, "op": "read", "schema": "s", "table": "t", "lsn": 5, "key": {"id": 1},
          "new": {"id": 1, "big": "x"}, "old": None}  # fmt: skip
    out = Oversized(JsonValues()).event("topic", ev, 999)
    assert orjson.loads(out) == reference(ev, 999)


def test_a_format_without_references_stops_with_what_to_fix() -> None:
    err = Oversized.record("a row of app.users", "dbz.app.users", 2_000_000, 1_048_576)
    assert isinstance(err, PermanentError)
    assert "2000000 bytes, more than topic dbz.app.users takes (1048576)" in str(err)
    assert err.hint is not None
    assert "max.message.bytes" in err.hint


@pytest.mark.parametrize("json_columns", [True, False], ids=["fast", "built"])
@pytest.mark.parametrize(("n", "every", "yields"), [(3, 2, [2, 1]), (4, 2, [2, 2, 0]),
                                                    (0, 2, [0]), (5, 10, [5])])  # fmt: skip
def test_sending_yields_every_so_many_rows_then_the_rest(
    json_columns: bool, n: int, every: int, yields: list[int]
) -> None:
    made = reads("table")
    rows = _with_hash(USERS, [((f"{i}", "x"), (f'{{"id":{i}}}', f'{{"id":{i},"name":"x"}}'))
                              for i in range(n)])  # fmt: skip
    rows = [r[1] if json_columns else r[0] for r in rows]
    at = replace(chunk(made, USERS), json_columns=json_columns)
    records, got, _ = sent(made, at, rows, every)
    assert got == yields
    assert [orjson.loads(v)["seq"] for v, _ in records] == list(range(n))


@pytest.mark.parametrize("json_columns", [True, False], ids=["fast", "built"])
def test_a_full_producer_queue_waits_for_room_and_loses_nothing(json_columns: bool) -> None:
    made = reads("primary_key")
    at = replace(chunk(made, USERS), json_columns=json_columns)
    rows = [r[1] if json_columns else r[0] for r in USERS_ROWS]
    records, _, sink = sent(made, at, rows, full={2})
    assert sink.waited == 1
    assert [orjson.loads(v)["key"]["id"] for v, _ in records] == [1, 2, 3]
