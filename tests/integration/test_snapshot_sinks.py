"""Snapshots through to the sinks: a database with rows, its initial snapshot indexed and
mirrored; then the slot is lost (torn down) and rows change behind walcast's back —
deleted, updated, inserted — and a new slot's initial snapshot makes both indices and the
Delta mirror equal the table again: read rows overwrite, the end marker removes the rows
deleted meanwhile. Compared with plain SQL, plain HTTP and the ``deltalake`` reader."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from services.pg2kafka import admin
from tests.integration.conftest import HarnessFactory, difference
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


def ends(seen: list[dict[str, Any]], table: str) -> int:
    return sum(
        e["op"] == "snapshot" and e["table"] == table and e["snapshot"]["phase"] == "end"
        for e in seen
    )


def test_a_new_slots_snapshot_makes_every_sink_equal_the_table_again(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,  # noqa: F811
    make_mirror: MirrorFactory,  # noqa: F811
    engine_kind: str,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    unique_name: str,
) -> None:
    table = f"snap_{unique_name[-8:]}"
    h = make_harness(
        init=False,
        snapshot={"mode": "initial", "workers": 2, "chunk_pages": 1},
        filters={"include": [f"public.{table}"]},
    )
    h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v text, n numeric)")
    h.sql(f"INSERT INTO {table} SELECT g, 'v' || g, g / 3.0 FROM generate_series(1, 300) g")
    admin.init(h.settings)
    h.start()
    h.events(lambda seen: ends(seen, table) == 1)
    topic = h.settings.producer.topic
    ix = make_indexer(topic).start()
    ix.wait(lambda: len(ix.docs(table)) == 300, "the first snapshot indexed")

    # The slot is lost; the table changes while nothing streams it.
    h.stop()
    admin.tear_down(h.settings)
    h.sql(f"DELETE FROM {table} WHERE id <= 40")
    h.sql(f"UPDATE {table} SET v = 'changed' WHERE id BETWEEN 41 AND 60")
    h.sql(f"INSERT INTO {table} SELECT g, 'new', 0 FROM generate_series(301, 320) g")
    admin.init(h.settings)
    h.start()
    h.events(lambda seen: ends(seen, table) == 2)
    h.sql(f"UPDATE {table} SET v = 'streamed' WHERE id = 61")  # a change after the snapshot
    h.events(lambda seen: any(e["op"] == "update" and e["table"] == table for e in seen))

    want = {
        str(i): {"id": i, "v": v, "n": n}
        for i, v, n in h.sql(f"SELECT id, v, n::text FROM {table}")
    }
    assert len(want) == 280
    ix.wait(lambda: ix.docs(table) == want, "the index equal to the table", timeout=90)

    if engine_kind != "opensearch":
        return  # the Delta mirror does not depend on the search engine: once is enough
    m = make_mirror(topic)
    m.run()
    rows = DeltaTable(str(m.path(table))).to_pyarrow_table().to_pylist()
    got = {str(r["id"]): {"id": r["id"], "v": r["v"], "n": r["n"]} for r in rows}
    assert got == want


def test_pgbench_default_order_under_tpcb_every_sink_equals_postgres(
    make_harness: HarnessFactory,
    make_indexer: IndexerFactory,  # noqa: F811
    make_mirror: MirrorFactory,  # noqa: F811
    engine_kind: str,  # noqa: F811
    spark: SparkSession,  # noqa: F811
    unique_name: str,
    stack_env: dict[str, str],
) -> None:
    """``pgbench -i`` in its default order (tables, data, then primary keys) with pg2kafka
    running, then TPC-B at once: each table joins the publication when it gains its key,
    is snapshotted by itself (incremental, while TPC-B writes to it), and the indices and
    the Delta mirror end equal to Postgres."""
    schema = f"pgb_{unique_name[-8:]}"
    h = make_harness(
        init=False,
        snapshot={"mode": "never", "automatic": True, "chunk_rows": 5000, "workers": 2},
        filters={"include": [f"{schema}.*"]},
        producer={"partition_key": "primary_key"},
    )
    h.sql(f"CREATE SCHEMA {schema}")
    admin.init(h.settings)
    h.start()
    env = {**os.environ, "PGOPTIONS": f"-c search_path={schema}"}
    dsn = stack_env["WALCAST_PG_DSN"]
    pgbench = shutil.which("pgbench") or "/usr/lib/postgresql/15/bin/pgbench"
    subprocess.run([pgbench, "-i", "-q", "-s", "1", dsn], env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    load = subprocess.Popen([pgbench, "-n", "-c", "2", "-j", "2", "-T", "10", dsn], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    tables = {"pgbench_accounts": "aid", "pgbench_branches": "bid", "pgbench_tellers": "tid"}
    try:
        h.events(lambda seen: all(ends(seen, t) >= 1 for t in tables), timeout=240)
    finally:
        _, err = load.communicate(timeout=120)
    assert load.returncode == 0, err.decode()[-2000:]
    h.sql(f"UPDATE {schema}.pgbench_branches SET filler = 'done' WHERE bid = 1")
    h.events(lambda seen: any(e["op"] == "update" and e["table"] == "pgbench_branches"
                              and (e["new"]["filler"] or "").startswith("done")
                              for e in seen))  # fmt: skip
    reads = [e for e in h.seen if e["op"] == "read" and e["table"] == "pgbench_accounts"]
    assert len(reads) >= 90_000  # the rows were never streamed: they came as reads

    def pg(table: str) -> dict[str, Any]:
        return {str(k): v for k, v in h.sql(
            f"SELECT {tables[table]}, to_jsonb(x) FROM {schema}.{table} x")}  # fmt: skip

    topic = h.settings.producer.topic
    ix = make_indexer(topic).start()
    # The Delta mirror (once, beside the opensearch case) reads the same finished topic
    # meanwhile: Spark's start-up and batches overlap the wait for the index.
    m = make_mirror(topic) if engine_kind == "opensearch" else None
    mirrored: list[BaseException | None] = []

    def mirror() -> None:
        try:
            assert m is not None
            m.run()
            mirrored.append(None)
        except BaseException as exc:  # noqa: BLE001 - raised on the test's thread below
            mirrored.append(exc)

    spark_run = threading.Thread(target=mirror, name="mirror", daemon=True)
    if m is not None:
        spark_run.start()
    try:
        for table in tables:
            want = pg(table)
            deadline = time.monotonic() + 180
            while True:
                read_at = time.monotonic()
                got = ix.docs_all(table, schema)
                if got == want or time.monotonic() > deadline:
                    break
                time.sleep(max(1.0, time.monotonic() - read_at))  # each look reads them all
            assert difference(want, got) == ([], [], []), (
                f"{table}: the index differs ({len(got)} of {len(want)} documents);"
                f" dead letters: {[d['headers'] for d in ix.dead_letters(3, timeout=3)]}"
            )
    finally:  # the mirror's run ends before its fixture's teardown, whatever happened
        if m is not None:
            spark_run.join(600)
    if m is None:
        return
    assert mirrored, "the mirror's run did not end within 600 s"
    if mirrored[0] is not None:
        raise mirrored[0]
    for table, key in tables.items():
        rows = DeltaTable(str(m.path(table, schema))).to_pyarrow_table().to_pylist()
        got = {str(r[key]): {k: v for k, v in r.items() if not k.startswith("_walcast_")}
               for r in rows}  # fmt: skip
        assert difference(pg(table), got) == ([], [], []), f"{table}: the mirror differs"
