"""Rows of insert-only tables (``append_only``, no key) in the index: each is one document
under its row id, whatever the redeliveries, restarts and consumer groups; a truncate
empties the index; when the table gains a key, its automatic snapshot's keyed rows take
over and the end marker removes the append-only documents (older than it). Events are
crafted by hand (as pg2kafka writes them) so that positions are chosen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from shared.kafka import ensure_topic
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2search.conftest import Indexer, IndexerFactory
from tests.integration.kafka2search.test_snapshot_events import S, marker, read

PREFIX = "append-only:"  # the documented id form, checked here without walcast's code


def appended(table: str, lsn: int, seq: int, value: int) -> bytes:
    """An insert of an insert-only table: no key, ``append_only``; the row
    ``{"id": value, "v": lsn}`` (two rows may be equal)."""
    ev = orjson.loads(change(table, "insert", lsn, value, keyless=True))
    return orjson.dumps(ev | {"seq": seq, "commit_lsn": lsn + 8, "append_only": True})


def row_doc_id(lsn: int, seq: int) -> str:
    return f"{PREFIX}{lsn + 8}.{seq}"


def stale(ix: Indexer) -> float:
    assert ix.service is not None
    value: float = ix.service.indexer.metrics.stale._value.get()
    return value


def test_append_only_rows_once_each_through_redelivery_restart_truncate_and_a_key(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.history"
    t = "history"
    ix = make_indexer(topic)
    config = ix.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    producer = Producer({"bootstrap.servers": ix.settings.kafka.bootstrap_servers})

    def send(*values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"")
        producer.flush(10)

    indexers: list[Indexer] = [ix]

    def until(current: Indexer, want: dict[str, dict[str, Any]], what: str) -> None:
        current.wait(lambda: current.docs(t) == want, what)

    try:
        # Two equal rows of one transaction (one COPY: same LSN, seq 0 and 1), a third.
        first = [appended(t, 100, 0, 1), appended(t, 100, 1, 1), appended(t, 200, 0, 2)]
        send(*first)
        want = {
            row_doc_id(100, 0): {"id": 1, "v": 100},
            row_doc_id(100, 1): {"id": 1, "v": 100},
            row_doc_id(200, 0): {"id": 2, "v": 200},
        }
        ix.start()
        until(ix, want, "the three rows, the two equal ones both kept")
        # The same records delivered again: refused as stale (same version), not added.
        before = stale(ix)
        send(*first)
        ix.wait(lambda: stale(ix) >= before + 3, "the redelivered rows counted stale")
        assert ix.docs(t) == want

        def restarted(make: Callable[[], Indexer], lsn: int, what: str) -> Indexer:
            """Stop the indexer, start ``make()``, add one row: the index must hold the
            same documents and that row (one partition: everything before it was read)."""
            indexers[-1].stop()
            nxt = make().start()
            indexers.append(nxt)
            send(appended(t, lsn, 0, 9))
            want[row_doc_id(lsn, 0)] = {"id": 9, "v": lsn}
            until(nxt, want, what)
            return nxt

        ix = restarted(lambda: make_indexer(topic), 300, "the same documents after a restart")
        fresh = {"group_id": f"{ix.settings.consumer.group_id}-fresh"}
        ix = restarted(
            lambda: make_indexer(topic, consumer=fresh), 310, "the same after a replay from 0"
        )
        # A truncate empties the index; a row after it lands.
        send(change(t, "truncate", 400), appended(t, 500, 0, 5))
        want = {row_doc_id(500, 0): {"id": 5, "v": 500}}
        until(ix, want, "only the row after the truncate")
        # The table gains a key: the automatic snapshot's keyed rows (version S), its end
        # marker; then an old append-only row redelivered: it stays out.
        send(appended(t, 600, 0, 6), marker(t, "start"), read(t, 1, 0), read(t, 5, 1))
        send(marker(t, "end", rows=2), appended(t, 600, 0, 6), change(t, "insert", S + 10, 7))
        want = {"1": {"id": 1, "v": S}, "5": {"id": 5, "v": S}, "7": {"id": 7, "v": S + 10}}
        until(ix, want, "only the keyed documents after the end marker")
    finally:
        for made in indexers:
            made.stop()
        client = AdminClient(config)
        client.delete_topics([topic])[topic].result(30)
