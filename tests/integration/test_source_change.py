"""A restored database behind a running pipeline: its LSNs are lower than those the sinks
hold, and its rows are not the ones they hold. pg2kafka must find out by itself, start
the next epoch and snapshot every table again, so that the index and the Delta mirror
equal the restored database — none of its changes refused as stale, none of the lost
rows left behind. Compared with plain SQL, plain HTTP and the ``deltalake`` reader.

The restore is the hardest kind to see: a base backup of the same cluster, so the same
system identifier and the same timeline; only the server's WAL position, behind what the
stream carried, gives it away (services/pg2kafka/source.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from services.pg2kafka import admin
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.source import SourceLedger
from tests.integration.conftest import Harness, delete_topic, difference, make_settings
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
from tests.pgcluster import PgCluster


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    c = PgCluster()
    try:
        c.start(wal_level="logical", max_wal_senders="10", max_replication_slots="10")
        yield c
    finally:
        c.remove()


def stream_settings(env_file: Path, name: str, cluster: PgCluster) -> Pg2KafkaSettings:
    """pg2kafka on the throwaway cluster: table ``items``, the initial snapshot on."""
    return make_settings(
        env_file, name,
        postgres={"host": "127.0.0.1", "port": cluster.port, "user": "postgres",
                  "password": "", "database": "postgres"},
        snapshot={"mode": "initial", "workers": 1},
        filters={"include": ["public.items"]},
    )  # fmt: skip


def sql(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def wal_lsn(dsn: str) -> int:
    return int(sql(dsn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def table(dsn: str) -> dict[str, dict[str, Any]]:
    return {str(i): {"id": i, "v": v} for i, v in sql(dsn, "SELECT id, v FROM items")}


def snapshots_ended(count: int) -> Any:
    def ended(seen: list[dict[str, Any]]) -> bool:
        ends = [e for e in seen if e["op"] == "snapshot" and e["snapshot"]["phase"] == "end"]
        return len(ends) == count

    return ended


def test_a_restored_database_with_lower_lsns_becomes_what_every_sink_holds(
    cluster: PgCluster,
    make_indexer: IndexerFactory,  # noqa: F811
    make_mirror: MirrorFactory,  # noqa: F811
    engine_kind: str,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    unique_name: str,
    env_file: Path,
) -> None:
    dsn = cluster.dsn
    settings = stream_settings(env_file, unique_name, cluster)
    topic = settings.producer.topic
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    sql(dsn, "INSERT INTO items SELECT g, 'first ' || g FROM generate_series(1, 200) g")
    admin.init(settings)
    backup = cluster.base_backup()  # what will be restored: 200 rows, the LSN of now

    # The original goes on: its history, which the restore will undo, reaches the sinks.
    sql(dsn, "UPDATE items SET v = 'lost update' WHERE id <= 50")
    sql(dsn, "DELETE FROM items WHERE id > 180")
    sql(dsn, "INSERT INTO items SELECT g, 'lost row' FROM generate_series(201, 220) g")
    for _ in range(3):  # 48 MB of WAL: the restored server starts well behind
        sql(dsn, "CREATE TABLE IF NOT EXISTS filler (n int); INSERT INTO filler VALUES (1)")
        sql(dsn, "SELECT pg_switch_wal()")
    h = Harness(settings, dsn)
    ix = make_indexer(topic)
    try:
        h.start()
        h.events(snapshots_ended(1), timeout=120)
        sql(dsn, "UPDATE items SET v = 'lost streamed' WHERE id BETWEEN 51 AND 60")
        h.events(lambda seen: any(e["op"] == "update" for e in seen))
        original = table(dsn)
        ix.start()
        ix.wait(lambda: ix.docs("items") == original, "the index equal to the original",
                timeout=120)  # fmt: skip
        m = make_mirror(topic) if engine_kind == "opensearch" else None
        if m is not None:
            m.run()
        h.stop()
        held = max(e["lsn"] for e in h.seen)

        # The database is restored from the backup: same cluster, same timeline, LSNs back.
        cluster.restore(backup)
        cluster.start()
        assert wal_lsn(dsn) < held, "the restored server is not behind the sinks"
        record = SourceLedger(settings).read()
        assert record is not None
        assert record.epoch == 0
        assert record.lsn > wal_lsn(dsn), (
            f"precondition: the stream's recorded position {record.lsn} is not beyond the"
            f" restored server's WAL ({wal_lsn(dsn)})"
        )
        sql(dsn, "UPDATE items SET v = 'restored, then changed' WHERE id <= 20")
        sql(dsn, "DELETE FROM items WHERE id BETWEEN 100 AND 110")
        sql(dsn, "INSERT INTO items SELECT g, 'restored, new' FROM generate_series(301, 310) g")

        h = Harness(settings, dsn, seen=h.seen, keys=h.keys, partitions=h.partitions,
                    consumer=h.consumer)  # fmt: skip
        h.start()
        h.events(snapshots_ended(2), timeout=120)
        sql(dsn, "UPDATE items SET v = 'restored, streamed' WHERE id IN (1, 55, 150)")
        h.events(lambda seen: sum(e["op"] == "update" and e["new"]["v"] == "restored, streamed"
                                  for e in seen) == 3)  # fmt: skip

        want = table(dsn)
        assert len(want) == 200 - 11 + 10
        deadline = time.monotonic() + 120
        while (got := ix.docs("items")) != want and time.monotonic() < deadline:
            time.sleep(0.5)
        differs = {}
        if got != want:
            differs["index"] = difference(want, got)
        if m is not None:
            m.run()
            rows = DeltaTable(str(m.path("items"))).to_pyarrow_table().to_pylist()
            mirrored = {str(r["id"]): {"id": r["id"], "v": r["v"]} for r in rows}
            if mirrored != want:
                differs["mirror"] = difference(want, mirrored)
        assert not differs, (
            f"{' and '.join(sorted(differs))} differ from Postgres (missing, left behind,"
            f" wrong): {differs}"
        )

        # What made it work: the restored server's events carry epoch 1 and lower LSNs.
        after = [e for e in h.seen if e.get("epoch") == 1 and e["op"] in ("read", "update")]
        assert len(after) == 199 + 3
        assert min(e["lsn"] for e in after) < held
        by_partition = list(zip(h.partitions, h.seen, strict=True))
        for p in set(h.partitions):  # in each partition the old epoch, then the new
            epochs = [e.get("epoch", 0) for q, e in by_partition if q == p]
            assert epochs == sorted(epochs), f"partition {p}: epochs out of order"
    finally:
        h.stop()
        if h.consumer is not None:
            h.consumer.close()
        ix.stop()  # before its topic goes
        delete_topic(settings)


def test_the_streams_own_server_after_a_crash_is_the_same_source(
    cluster: PgCluster, unique_name: str, env_file: Path
) -> None:
    """A crash may take a logical slot's confirmed position back to the last checkpoint,
    but never the server's WAL: the server that crashed is the same source, streamed on
    in the same epoch, and nothing is snapshotted again."""
    dsn = cluster.dsn
    settings = stream_settings(env_file, unique_name, cluster)
    sql(dsn, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    sql(dsn, "INSERT INTO items SELECT g, 'first' FROM generate_series(1, 50) g")
    admin.init(settings)
    h = Harness(settings, dsn)
    try:
        h.start()
        h.events(snapshots_ended(1), timeout=120)
        sql(dsn, "UPDATE items SET v = 'before the crash' WHERE id <= 10")
        h.events(lambda seen: sum(e["op"] == "update" for e in seen) == 10)
        deadline = time.monotonic() + 60
        while (record := SourceLedger(settings).read()) is None or record.lsn == 0:
            assert time.monotonic() < deadline, f"the stream's position was not recorded: {record}"
            time.sleep(0.5)
        h.stop()
        cluster.stop("immediate")  # a crash
        cluster.start()
        sql(dsn, "UPDATE items SET v = 'after the crash' WHERE id = 20")
        h = Harness(settings, dsn, seen=h.seen, keys=h.keys, partitions=h.partitions,
                    consumer=h.consumer)  # fmt: skip
        h.start()
        h.events(lambda seen: any(e["op"] == "update" and e["new"]["v"] == "after the crash"
                                  for e in seen))  # fmt: skip
        assert all("epoch" not in e for e in h.seen)
        assert sum(e["op"] == "snapshot" for e in h.seen) == 2  # one start, one end: no other
        after = SourceLedger(settings).read()
        assert after is not None
        assert (after.epoch, after.system) == (0, record.system)
    finally:
        h.stop()
        if h.consumer is not None:
            h.consumer.close()
        delete_topic(settings)
