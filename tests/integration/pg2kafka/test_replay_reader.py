"""The replay's read-ahead (:class:`services.pg2kafka.replay._QueueReader`) against the real
queue: every queued event once, in seq order, batch ends where batches end, a stop in
the middle of a COPY that leaves nothing behind, and a read failure raised to the caller."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from services.pg2kafka.replay import _QueueReader, replay_query
from tests.integration.conftest import Harness


@pytest.fixture
def queued(harness: Harness) -> Iterator[tuple[Harness, int, list[int]]]:
    """A stream with 23 queued events; yields (harness, stream id, the event ids in seq
    order)."""
    stream = 8 * 10**9 + random.randint(0, 10**8)
    h = harness
    h.sql("INSERT INTO _walcast.streams (id) VALUES (%s)", [stream])
    h.sql(
        "INSERT INTO _walcast.events (payload, stream_id) SELECT jsonb_build_object("
        "'tg_name', 't', 'n', g), %s FROM generate_series(1, 23) g",
        [stream],
    )
    h.sql(  # seq order is not id order: the queue's order is what counts
        "INSERT INTO _walcast.replay_queue (stream_id, event_created_at, event_id)"
        " SELECT %s, created_at, id FROM _walcast.events WHERE stream_id = %s"
        " ORDER BY (payload ->> 'n')::int %% 5, id",
        [stream, stream],
    )
    ids = [
        int(r[0])
        for r in h.sql(
            "SELECT event_id FROM _walcast.replay_queue WHERE stream_id = %s ORDER BY seq",
            [stream],
        )
    ]
    try:
        yield h, stream, ids
    finally:
        h.sql("DELETE FROM _walcast.replay_queue WHERE stream_id = %s", [stream])
        h.sql("DELETE FROM _walcast.events WHERE stream_id = %s", [stream])
        h.sql("DELETE FROM _walcast.streams WHERE id = %s", [stream])


@pytest.mark.parametrize(("batch", "chunk_rows"), [(6, 3), (5, 2), (50, 4), (1, 1)])
def test_every_queued_event_comes_once_in_seq_order_with_its_batch_ends(
    queued: tuple[Harness, int, list[int]], batch: int, chunk_rows: int
) -> None:
    """(6, 3): batches end exactly at a chunk boundary (an empty closing chunk); (5, 2):
    mid-chunk; (50, 4): one batch; (1, 1): one event per batch."""
    h, stream, ids = queued
    query = replay_query(stream, batch, None)
    got: list[int] = []
    ends: list[tuple[int, int]] = []
    seqs: list[int] = []
    with _QueueReader(h.settings.postgres.conninfo(), query, [], chunk_rows=chunk_rows) as r:
        for rows, end in r:
            assert len(rows) <= chunk_rows
            got += [int(row[1]) for row in rows]
            seqs += [int(row[0]) for row in rows]
            if end is not None:
                ends.append((end.last_seq, end.rows))
    assert got == ids
    expected_ends = [
        (seqs[min(i + batch, len(seqs)) - 1], min(batch, len(seqs) - i))
        for i in range(0, len(seqs), batch)
    ]
    assert ends == expected_ends


def test_leaving_mid_copy_stops_the_reader_and_frees_its_connection(
    queued: tuple[Harness, int, list[int]],
) -> None:
    h, stream, _ = queued
    query = replay_query(stream, 1000, None)
    name = f"walcast-test-reader-{stream}"
    conninfo = h.settings.postgres.conninfo() + f" application_name={name}"
    reader = _QueueReader(conninfo, query, [], chunk_rows=1, chunks=1)
    with reader:
        first = next(iter(reader))
        assert len(first[0]) == 1  # the reader is now blocked mid-COPY on a full hand-off
    assert not reader.thread.is_alive()
    deadline = time.monotonic() + 30
    while True:  # the server ends the backend once the client closed the connection
        left = h.sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        if left[0][0] == 0:
            break
        assert time.monotonic() < deadline, "the reader's connection is still open"
        time.sleep(0.1)


def test_a_read_failure_is_raised_to_the_caller(harness: Harness) -> None:
    """Not swallowed on the reader thread, and the caller is not left waiting."""
    failing = sql.SQL("COPY (SELECT 1 / (%(after)s::int * 0)) TO STDOUT")
    failures: list[BaseException] = []

    def read() -> None:
        try:
            with _QueueReader(harness.settings.postgres.conninfo(), failing, []) as r:
                for _ in r:
                    pass
        except psycopg.Error as exc:
            failures.append(exc)

    t = threading.Thread(target=read)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the caller was left waiting"
    assert len(failures) == 1
    assert isinstance(failures[0], psycopg.errors.DivisionByZero)
