"""A table dropped while the initial snapshot is half way: its chunks left cannot be read
(the relation is gone, or its name is another table's now). pg2kafka ends its snapshot
without them and streams on — the stream carries the drop and whatever came after —
instead of retrying the read forever (the composition suite's seed 39 on a loaded
machine: "relation ... of the snapshot is gone", sixteen attempts, then exit). A table
renamed meanwhile is still read, whole, under the name the snapshot began with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from services.pg2kafka import admin
from tests.integration.conftest import HarnessFactory, difference

REPO = Path(__file__).resolve().parents[3]
FAILPOINT_EXIT = 86
TABLES = ("kept", "gone", "again", "moved")


def folded(events: list[dict[str, Any]], table: str) -> dict[int, str]:
    """The table's rows by the events alone (shares no code with walcast): the newest
    version of each key after the table's last creation or drop; deletes remove."""
    mine = [e for e in events if e.get("table") == table]
    since = max((e["lsn"] for e in mine if e["op"] == "ddl"), default=-1)
    rows: dict[int, tuple[int, str | None]] = {}
    for e in mine:
        if e["op"] not in ("read", "insert", "update", "delete") or e["lsn"] <= since:
            continue
        key = int((e["key"] or e["new"])["id"])
        if key not in rows or e["lsn"] >= rows[key][0]:
            rows[key] = (e["lsn"], None if e["op"] == "delete" else str(e["new"]["pad"]))
    return {k: v for k, (_, v) in rows.items() if v is not None}


def test_a_table_dropped_mid_snapshot_ends_its_snapshot_and_the_stream_goes_on(
    make_harness: HarnessFactory, unique_name: str, env_file: Path, tmp_path: Path
) -> None:
    schema = f"s_{unique_name}"
    h = make_harness(
        init=False,
        snapshot={"mode": "initial", "workers": 1, "chunk_pages": 2},
        filters={"include": [f"{schema}.*"]},
    )
    h.sql(f"CREATE SCHEMA {schema}")
    for t in TABLES:  # ~25 pages each: a dozen chunks of 2 pages
        h.sql(f"CREATE TABLE {schema}.{t} (id int PRIMARY KEY, pad text)")
        h.sql(f"INSERT INTO {schema}.{t} SELECT g, '{t} ' || repeat('x', 40) || g"
              " FROM generate_series(1, 2500) g")  # fmt: skip
    s = h.settings
    admin.init(s)
    env = {
        **os.environ,
        "PG2KAFKA_REPLICATION__SLOT": s.replication.slot,
        "PG2KAFKA_REPLICATION__PUBLICATION": s.replication.publication,
        "PG2KAFKA_PRODUCER__TOPIC": s.producer.topic,
        "PG2KAFKA_FILTERS__INCLUDE": f'["{schema}.*"]',
        "PG2KAFKA_SNAPSHOT__MODE": "initial",
        "PG2KAFKA_SNAPSHOT__WORKERS": "1",
        "PG2KAFKA_SNAPSHOT__CHUNK_PAGES": "2",
        "PG2KAFKA_HTTP__ENABLED": "false",
        "PG2KAFKA_LOG__FORMAT": "text",
    }
    cmd = [sys.executable, "-m", "services.pg2kafka", "--env-file", str(env_file), "run"]
    log_path = tmp_path / "pg2kafka.log"
    with log_path.open("w") as log:
        first = subprocess.run(
            cmd, env={**env, "WALCAST_FAILPOINTS": "snapshot.chunk_done=exit@1"}, cwd=REPO,
            stdout=log, stderr=subprocess.STDOUT, timeout=180, check=False,
        )  # fmt: skip
    assert first.returncode == FAILPOINT_EXIT, log_path.read_text()[-3000:]
    # after the slot's point: one table dropped, one dropped and made again, changes
    h.sql(f"DROP TABLE {schema}.gone")
    h.sql(f"DROP TABLE {schema}.again")
    h.sql(f"CREATE TABLE {schema}.again (id int PRIMARY KEY, pad text)")
    h.sql(f"INSERT INTO {schema}.again SELECT g, 'new ' || g FROM generate_series(1, 20) g")
    h.sql(f"ALTER TABLE {schema}.moved RENAME TO moved_now")  # still there: read it
    h.sql(f"UPDATE {schema}.kept SET pad = 'changed' WHERE id % 500 = 0")
    h.sql(f"INSERT INTO {schema}.kept VALUES (9999, 'the last')")

    with log_path.open("a") as log:
        second = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:

            def caught_up(seen: list[dict[str, Any]]) -> bool:
                assert second.poll() is None, log_path.read_text()[-3000:]
                ends = {e["table"] for e in seen if e["op"] == "snapshot"
                        and e["snapshot"]["phase"] == "end"}  # fmt: skip
                last = any(e["op"] == "insert" and e["new"]["id"] == 9999 for e in seen)
                return ends >= set(TABLES) and last

            h.events(caught_up, timeout=180)
        finally:
            second.terminate()
            second.wait(60)
    text = log_path.read_text()
    assert "gone was dropped after the slot's point" in text, text[-3000:]
    assert "again was dropped after the slot's point" in text, text[-3000:]
    assert "of the snapshot is gone" not in text
    # no row of the new ``again`` came as a read of the old one's snapshot
    reads = [e for e in h.seen if e["op"] == "read" and e["table"] == "again"]
    assert all(str(e["new"]["pad"]).startswith("again ") for e in reads)
    for t in ("kept", "again"):
        want = {int(r[0]): str(r[1]) for r in h.sql(f"SELECT id, pad FROM {schema}.{t}")}
        assert difference(want, folded(h.seen, t)) == ([], [], []), t
    # the renamed table's rows all came, read, under the name the snapshot began with
    assert "moved was" not in text
    moved = {int(e["new"]["id"]): str(e["new"]["pad"]) for e in h.seen
             if e["op"] == "read" and e["table"] == "moved"}  # fmt: skip
    want = {int(r[0]): str(r[1]) for r in h.sql(f"SELECT id, pad FROM {schema}.moved_now")}
    assert difference(want, moved) == ([], [], [])
    drops = [e for e in h.seen if e["op"] == "ddl" and e["table"] == "gone"]
    assert drops, "the drop of gone never came"
    assert drops[-1]["ddl"]["dropped"] is True
