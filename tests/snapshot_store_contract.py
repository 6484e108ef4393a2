"""What every :class:`~services.pg2kafka.snapshots.store.SnapshotStore` does, held against
the in-memory store (``tests/unit/pg2kafka/test_snapshot_store.py``) and the Postgres one
(``tests/integration/pg2kafka/test_snapshot_store.py``): claiming in order and never
twice, resuming a run killed mid-chunk, recording a chunk once, chunks read again, floors
that never move back, ended runs that stay ended.

A check takes a :class:`Stores`: ``open()`` is another reader's handle on the same state
(its own connection, for Postgres); ``slot`` is unique to the test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.snapshots.chunks import Bounds, Chunk, Job, TableSpec
from services.pg2kafka.snapshots.store import SnapshotStore


@dataclass
class Stores:
    open: Callable[[], SnapshotStore]
    slot: str


def spec(schema: str, name: str, oid: int) -> TableSpec:
    columns = (pg.Column("id", 23, -1, True), pg.Column("v", 25, -1, False))
    return TableSpec(pg.Relation(oid, schema, name, "d", columns), ((oid, 10),), 100)


def pages(n: int) -> Callable[[TableSpec], list[Bounds]]:
    """``n`` page ranges of each table (the last open-ended, as plan_chunks makes them)."""
    return lambda t: [(t.leaves[0][0], i, None if i == n - 1 else i + 1, None, None, "[)")
                      for i in range(n)]  # fmt: skip


def keys(bounds: list[tuple[str, str]], ends: str = "[)") -> Callable[[TableSpec], list[Bounds]]:
    return lambda _t: [(None, None, None, [lo], [hi], ends) for lo, hi in bounds]


def two_tables(store: SnapshotStore, slot: str, kind: str = "initial") -> Job:
    """A run of ``s.a`` (3 chunks) then ``s.b`` (2 chunks) at version 1000."""
    tables = [spec("s", "a", 9001), spec("s", "b", 9002)]
    sizes = {"a": 3, "b": 2}
    return store.create(slot, kind, 1000, tables, lambda t: pages(sizes[t.name])(t),
                        "contract test", None)  # fmt: skip


def claimed(chunk: Chunk | None) -> tuple[str, int]:
    assert chunk is not None
    return chunk.table, chunk.chunk


def check_claims_go_in_table_order_then_chunk_order_each_once(stores: Stores) -> None:
    first, second = stores.open(), stores.open()
    try:
        job = two_tables(first, stores.slot)
        seen = []
        for reader in (first, second, second, first, second):
            seen.append(claimed(reader.claim(job)))
        assert seen == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
        assert first.claim(job) is None
        assert second.claim(job) is None
        states = {
            t["table"]: (t["state"], t["chunks"], t["chunks_done"]) for t in first.progress(job)
        }
        assert states == {"s.a": ("running", 3, 0), "s.b": ("running", 2, 0)}
    finally:
        first.close()
        second.close()


def check_concurrent_readers_never_share_a_chunk(stores: Stores) -> None:
    setup = stores.open()
    try:
        tables = [spec("s", f"t{i}", 9100 + i) for i in range(4)]
        job = setup.create(stores.slot, "initial", 1000, tables, pages(10), "contract test", None)
    finally:
        setup.close()
    got: list[list[tuple[str, int]]] = [[] for _ in range(4)]

    def read(n: int) -> None:
        store = stores.open()
        try:
            while (chunk := store.claim(job)) is not None:
                got[n].append((chunk.table, chunk.chunk))
                store.chunk_done(chunk, 1, 1000)
        finally:
            store.close()

    threads = [threading.Thread(target=read, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    everything = [c for mine in got for c in mine]
    assert sorted(everything) == sorted((f"t{i}", c) for i in range(4) for c in range(10))
    assert len(set(everything)) == len(everything)
    check = stores.open()
    try:
        assert [t[:2] for t in check.tables_to_close(job)] == [("s", f"t{i}") for i in range(4)]
        assert all(check.table_counts(job.id, "s", f"t{i}") == (0, 10) for i in range(4))
    finally:
        check.close()


def check_a_run_killed_mid_chunk_resumes_at_its_unfinished_chunks(stores: Stores) -> None:
    store = stores.open()
    job = two_tables(store, stores.slot)
    a0, a1, a2 = store.claim(job), store.claim(job), store.claim(job)
    assert a0 is not None
    assert a1 is not None
    assert a2 is not None
    assert store.chunk_done(a1, 7, 1000) is False  # acknowledged: recorded; a0, a2 in flight
    store.close()  # the process dies
    again = stores.open()
    try:
        resumed = again.unfinished(stores.slot, "initial")
        assert resumed is not None
        assert resumed.id == job.id
        assert resumed.version == 1000
        assert again.requeue_running(resumed) == 2
        order = []
        while (chunk := again.claim(resumed)) is not None:
            order.append((chunk.table, chunk.chunk))
            last = again.chunk_done(chunk, 5, 1000)
            assert last == ((chunk.table, chunk.chunk) in (("a", 2), ("b", 1)))
        assert order == [("a", 0), ("a", 2), ("b", 0), ("b", 1)]  # a1 is not read twice
        assert again.table_counts(job.id, "s", "a") == (0, 17)
        assert again.tables_to_close(resumed) == [("s", "a", 1000, 17), ("s", "b", 1000, 10)]
        assert again.finish_if_complete(job.id) is False  # end markers not sent yet
        again.table_done(resumed, "s", "a")
        assert again.tables_to_close(resumed) == [("s", "b", 1000, 10)]
        again.table_done(resumed, "s", "b")
        assert again.finish_if_complete(job.id) is True
        assert again.state(resumed) == "done"
        assert again.unfinished(stores.slot, "initial") is None
    finally:
        again.close()


def check_a_chunk_recorded_twice_counts_once(stores: Stores) -> None:
    store = stores.open()
    try:
        job = two_tables(store, stores.slot)
        chunk = store.claim(job)
        assert chunk is not None
        assert store.chunk_done(chunk, 4, 1000) is False
        assert store.chunk_done(chunk, 4, 1000) is False
        assert store.table_counts(job.id, "s", "a") == (2, 4)
        assert store.table_counts(job.id, "s", "nothing") == (0, 0)
        assert store.start_version(job.id, "s", "a") == 1000
        assert store.start_version(job.id, "s", "nothing") == 0
    finally:
        store.close()


def check_a_requeued_chunk_is_claimed_again(stores: Stores) -> None:
    store = stores.open()
    try:
        job = two_tables(store, stores.slot)
        chunk = store.claim(job)
        assert chunk is not None
        store.requeue(chunk)
        assert claimed(store.claim(job)) == ("a", 0)
        assert claimed(store.claim(job)) == ("a", 1)
    finally:
        store.close()


def check_keys_read_again_are_a_chunk_of_their_own(stores: Stores) -> None:
    store = stores.open()
    try:
        job = store.create(stores.slot, "incremental", 2000, [spec("s", "k", 9201)],
                           keys([("1", "50"), ("50", "99")]), "contract test", None)  # fmt: skip
        first = store.claim(job)
        assert first is not None
        assert (first.lower_key, first.upper_key) == (["1"], ["50"])
        assert first.only_keys is None
        number = store.read_again(first, ['{"id":7}', '{"id":9}'])
        assert number == 2
        assert store.table_counts(job.id, "s", "k") == (3, 0)
        assert store.chunk_done(first, 40, 2000) is False  # the keys read again are pending
        second = store.claim(job)
        assert second is not None
        assert second.chunk == 1
        assert store.chunk_done(second, 30, 2000) is False
        again = store.claim(job)
        assert again is not None
        assert again.chunk == 2
        assert (again.lower_key, again.upper_key) == (["1"], ["50"])
        assert again.only_keys == ['{"id":7}', '{"id":9}']
        assert store.chunk_done(again, 2, 2000) is True
        assert store.table_counts(job.id, "s", "k") == (0, 72)
        gone = Chunk(job.id + 1000, "s", "k", 0, None, None, None)
        assert store.read_again(gone, ['{"id":1}']) is None
        assert [j.id for j in store.running_incremental(stores.slot)] == [job.id]
        assert store.table_key_ranges(job.id, "s", "k") is None  # the whole table
    finally:
        store.close()


def check_a_run_of_key_ranges_keeps_its_ranges_and_each_chunks_bounds(stores: Stores) -> None:
    store = stores.open()
    try:
        ranges = {"columns": ["id"], "ranges": [[[4], [12]]]}
        job = store.create(stores.slot, "incremental", 2100, [spec("s", "r", 9301)],
                           keys([("4", "12")], "(]"), "contract test", None,
                           {("s", "r"): ranges})  # fmt: skip
        assert store.table_key_ranges(job.id, "s", "r") == ranges
        assert store.table_key_ranges(job.id, "s", "other") is None
        first = store.claim(job)
        assert first is not None
        assert (first.lower_key, first.upper_key, first.bounds) == (["4"], ["12"], "(]")
        assert store.read_again(first, ['{"id":7}']) == 1
        again = store.claim(job)
        assert again is not None
        assert (again.bounds, again.only_keys) == ("(]", ['{"id":7}'])
    finally:
        store.close()


def check_floors_never_move_back(stores: Stores) -> None:
    store = stores.open()
    try:
        job = store.create(stores.slot, "incremental", 3000, [spec("s", "f", 9301)], pages(1),
                           "contract test", None)  # fmt: skip
        store.record_floor(stores.slot, "s", "f", 5000)
        store.record_floor(stores.slot, "s", "f", 4000)
        store.record_floor(stores.slot, "s", "g", 100)
        assert store.floors(stores.slot) == {("s", "f"): 5000, ("s", "g"): 100}
        store.finish(job, "done")
        assert store.floors(stores.slot) == {("s", "f"): 5000, ("s", "g"): 100}
    finally:
        store.close()


def check_an_ended_run_stays_ended(stores: Stores) -> None:
    store = stores.open()
    try:
        job = two_tables(store, stores.slot, kind="incremental")
        store.finish(job, "cancelled")
        store.finish(job, "done")
        assert store.state(job) == "cancelled"
        assert store.unfinished(stores.slot, "incremental") is None
        assert store.running_incremental(stores.slot) == []
        assert store.finish_if_complete(job.id) is False
        missing = Job(job.id + 1000, stores.slot, "initial", 0, "running")
        assert store.state(missing) == "failed"
    finally:
        store.close()


CHECKS = [
    check_claims_go_in_table_order_then_chunk_order_each_once,
    check_concurrent_readers_never_share_a_chunk,
    check_a_run_killed_mid_chunk_resumes_at_its_unfinished_chunks,
    check_a_chunk_recorded_twice_counts_once,
    check_a_requeued_chunk_is_claimed_again,
    check_keys_read_again_are_a_chunk_of_their_own,
    check_a_run_of_key_ranges_keeps_its_ranges_and_each_chunks_bounds,
    check_floors_never_move_back,
    check_an_ended_run_stays_ended,
]
