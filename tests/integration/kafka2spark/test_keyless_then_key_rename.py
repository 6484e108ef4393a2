"""A table created and filled without a key (its rows mirrored as append-only rows), then
given a key (its automatic snapshot's rows MERGEd by key into the same mirror), then a
column renamed while the snapshot had not read its chunk yet: the renamed column keeps
its values in Delta. Read back with ``deltalake``, compared with plain SQL.

The chunk read after the rename carries the new column name but a version below the
rename (the slot's restart position minus one, held back here by an open transaction):
in the batch that holds both, its rows come before the DDL by LSN, and they brought the
new column into the mirror before the DDL was applied (issue 37, defect 3: seen by the
composition suite, seed 22)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from services.pg2kafka import admin
from services.pg2kafka.snapshots.incremental import Incremental
from tests.integration.conftest import Harness, HarnessFactory
from tests.integration.kafka2spark.conftest import MirrorFactory, wait_for


def pg_table(h: Harness, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(h.sql(f"SELECT {', '.join(columns)} FROM {table}"), key=repr)


def delta_table(path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted((tuple(r.get(c) for c in columns) for r in rows), key=repr)


def mismatch(want: list[tuple[Any, ...]], got: list[tuple[Any, ...]]) -> str:
    w, g = set(want), set(got)
    return (
        f"{len(w - g)} rows of Postgres missing or different, e.g. {sorted(w - g, key=repr)[:3]};"
        f" {len(g - w)} in Delta, e.g. {sorted(g - w, key=repr)[:3]}"
    )


def count(h: Harness, table: str, op: str, where: Callable[[dict[str, Any]], bool]) -> int:
    return sum(1 for e in h.table_events(table) if e["op"] == op and where(e))


def restart_lsn(h: Harness) -> int:
    rows = h.sql(
        "SELECT restart_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
        [h.settings.replication.slot],
    )
    return int(rows[0][0])


def current_lsn(h: Harness) -> int:
    return int(h.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def test_a_column_renamed_before_the_keys_snapshot_read_it_keeps_its_values(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The snapshot's chunk is read only once the test lets it (after the rename).
    gate = threading.Event()
    read_chunk = Incremental.read_chunk

    def gated(self: Incremental, *args: Any) -> bool:
        while not gate.wait(0.2):
            if self.stop.is_set():
                return False
        return read_chunk(self, *args)

    monkeypatch.setattr(Incremental, "read_chunk", gated)
    h = make_harness(
        snapshot={"mode": "never", "automatic": True}, producer={"partition_key": "table"}
    )
    t = f"ka_{h.settings.replication.slot[-8:]}"
    h.start()
    m = make_mirror(h.settings.producer.topic)
    h.sql(f"CREATE TABLE {t} (id int NOT NULL, n int, note text, small int)")
    h.sql(f"INSERT INTO {t} SELECT g, 0, 'note ' || g, g % 100 FROM generate_series(1, 300) g")
    h.events(lambda seen: count(h, t, "insert", lambda e: True) >= 300)
    m.run()  # the mirror of the insert-only table: append-only rows

    h.sql(f"ALTER TABLE {t} ADD PRIMARY KEY (id)")  # its snapshot waits at the gate
    h.sql(f"UPDATE {t} SET n = n + 1 WHERE id % 3 = 0")
    h.events(lambda seen: count(h, t, "update", lambda e: True) >= 100)
    m.run()  # the key's DDL applied, the updates MERGEd by key
    # The chunk's version (restart position - 1) above the key's DDL, below the rename.
    above = current_lsn(h)
    wait_for(lambda: h.sql("CHECKPOINT") == [] and restart_lsn(h) > above,
             "the slot's restart position past the updates", timeout=60)  # fmt: skip
    with psycopg.connect(h.dsn, autocommit=True) as old:
        old.execute("BEGIN")
        old.execute("SELECT pg_logical_emit_message(true, 'walcast-test', 'hold')")
        h.sql(f"UPDATE {t} SET n = n + 10 WHERE id % 5 = 0")  # above the chunk's version
        h.events(lambda seen: count(h, t, "update", lambda e: e["new"]["n"] >= 10) >= 60)
        m.run()
        h.sql(f"ALTER TABLE {t} RENAME COLUMN note TO remark")
        gate.set()
        deadline = time.monotonic() + 180
        while not any(s["state"] == "done" for s in admin.snapshot_status(h.settings)):
            assert time.monotonic() < deadline, "the key's snapshot did not finish"
            time.sleep(0.5)
        old.execute("COMMIT")
    h.events(lambda seen: count(h, t, "snapshot", lambda e: e["snapshot"]["phase"] == "end") > 0)
    reads = [e for e in h.table_events(t) if e["op"] == "read"]
    (rename,) = [e for e in h.seen if e.get("table") == t and "RENAME" in str(e.get("ddl"))]
    assert reads
    assert all("remark" in e["new"] and e["lsn"] < rename["lsn"] for e in reads)
    m.run()  # the rename and the read rows in one batch
    cols = ["id", "n", "remark", "small"]
    want, got = pg_table(h, t, cols), delta_table(m.path(t), cols)
    assert got == want, mismatch(want, got)


def test_rename_drop_and_add_on_a_table_still_insert_only(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    """The same DDL while the table has no key: its mirror, made of append-only rows,
    keeps the renamed column's values, loses the dropped one, gains the added one."""
    h = make_harness()
    t = f"kl_{h.settings.replication.slot[-8:]}"
    h.sql(f"CREATE TABLE {t} (id int NOT NULL, note text, small int)")  # no CREATE event
    h.sql(f"INSERT INTO {t} SELECT g, 'note ' || g, g FROM generate_series(1, 50) g")
    h.start()
    m = make_mirror(h.settings.producer.topic)
    h.sql(f"INSERT INTO {t} SELECT g, 'note ' || g, g FROM generate_series(51, 100) g")
    h.events(lambda seen: count(h, t, "insert", lambda e: True) >= 50)
    m.run()  # the mirror created by append-only rows, no DDL seen yet
    h.sql(f"ALTER TABLE {t} RENAME COLUMN note TO remark")
    h.sql(f"ALTER TABLE {t} DROP COLUMN small")
    h.sql(f"ALTER TABLE {t} ADD COLUMN added int")
    h.sql(f"INSERT INTO {t} SELECT g, 'r ' || g, g FROM generate_series(101, 120) g")
    h.events(lambda seen: count(h, t, "insert", lambda e: True) >= 70)
    m.run()
    cols = ["id", "remark", "added"]
    want = pg_table(h, t, cols)  # 1-50 by the initial snapshot, the others streamed
    got = delta_table(m.path(t), cols)
    assert got == want, mismatch(want, got)
    assert "small" not in DeltaTable(str(m.path(t))).to_pyarrow_table().column_names
