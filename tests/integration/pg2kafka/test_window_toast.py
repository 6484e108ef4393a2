"""Issue 37, defect 5: a row updated inside its chunk's window by an update that leaves
its TOAST value out (pgoutput's "unchanged") is dropped from the chunk — the stream
carried the change — but a sink that never held the row cannot complete it from that
change. pg2kafka reads such keys again in a chunk of their own, in a later window.

The update is made at the worst moment — the chunk read, its high watermark not yet
written — by the ``incremental.chunk_read`` failpoint's place, not by timing. What the
stream brings a sink to is computed here from the events alone (no walcast code), with
the rule every sink keeps: a row missing a TOAST value takes it from an older full row.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest

from services.pg2kafka import admin
from services.pg2kafka.snapshots import incremental
from tests.integration.conftest import HarnessFactory, data, difference


def sink_with_fill(events: list[dict[str, Any]], table: str) -> dict[int, dict[str, Any]]:
    """The rows a sink ends with: newest version per key wins; an update without some
    columns (``unchanged_toast``) keeps the held values of those columns or, holding
    none, waits for them; an older row that has them fills them; a delete removes the
    row; a snapshot's end marker removes what is older than its start."""
    held: dict[int, tuple[int, dict[str, Any], set[str]]] = {}
    for e in events:
        if e.get("table") != table:
            continue
        if e["op"] == "snapshot" and e["snapshot"]["phase"] == "end":
            held = {k: v for k, v in held.items() if v[0] >= e["lsn"]}
        elif e["op"] in ("insert", "update", "read"):
            key = e["key"]["id"]
            lacking = set(e.get("unchanged_toast") or ())
            row = {c: v for c, v in e["new"].items() if c not in lacking}
            if key not in held or e["lsn"] > held[key][0]:
                base = held.get(key, (0, {}, set(lacking)))
                kept = {c: base[1][c] for c in lacking if c in base[1]}
                held[key] = (e["lsn"], {**row, **kept}, lacking - set(kept))
            elif held[key][2] and not lacking:
                version, have, waiting = held[key]
                held[key] = (version, {**have, **{c: row[c] for c in waiting}}, set())
        elif e["op"] == "delete":
            key = e["key"]["id"]
            if key in held and e["lsn"] > held[key][0]:
                del held[key]
    return {k: v[1] for k, v in held.items()}


def test_a_row_updated_in_its_chunks_window_without_its_toast_value_is_read_again(
    make_harness: HarnessFactory, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = f"w_{unique_name}"
    h = make_harness(
        init=False,
        snapshot={"mode": "never", "automatic": False, "chunk_rows": 50, "workers": 1},
        filters={"include": [f"{schema}.*"]},
    )
    big = secrets.token_hex(6000)  # 12 kB of hex: stored out of line (TOAST)
    h.sql(f"CREATE SCHEMA {schema}")
    h.sql(f"CREATE TABLE {schema}.t (id int PRIMARY KEY, v int, doc text)")
    h.sql(f"INSERT INTO {schema}.t SELECT g, 0, %s || g FROM generate_series(1, 200) g", [big])
    admin.init(h.settings)

    # Inside the first chunk's window (keys 1-49): key 3 updated leaving its TOAST value
    # out; key 4 updated with a new one (the change carries the whole row: nothing to
    # read again); key 5 updated without its TOAST value, then deleted.
    place = incremental.failpoint
    done: list[str] = []

    def in_window(name: str) -> None:
        if name == "incremental.chunk_read" and not done:
            h.sql(f"UPDATE {schema}.t SET v = 1 WHERE id = 3")
            h.sql(f"UPDATE {schema}.t SET doc = 'short' WHERE id = 4")
            h.sql(f"UPDATE {schema}.t SET v = 1 WHERE id = 5")
            h.sql(f"DELETE FROM {schema}.t WHERE id = 5")
            done.append(name)
        place(name)

    monkeypatch.setattr(incremental, "failpoint", in_window)
    h.start()
    admin.snapshot_request(h.settings, [f"{schema}.t"])
    h.events(lambda seen: any(e["op"] == "snapshot" and e["snapshot"]["phase"] == "end"
                              for e in data(seen, "t")), timeout=120)  # fmt: skip
    assert done, "the chunk was never read"
    events = data(h.seen, "t")
    partial = [e for e in events if e["op"] == "update" and e["key"]["id"] == 3]
    assert [e.get("unchanged_toast") for e in partial] == [["doc"]], partial
    at = events.index(partial[0])
    reads = {k: [e for e in events if e["op"] == "read" and e["key"]["id"] == k]
             for k in (3, 4, 5)}  # fmt: skip
    # Key 3: read again after its update, in a chunk of its own, with its TOAST value.
    assert len(reads[3]) == 1, reads[3]
    assert events.index(reads[3][0]) > at
    assert reads[3][0]["new"]["doc"] == big + "3"
    assert reads[3][0]["snapshot"]["chunk"] >= 5  # chunks 0-4 are the key ranges
    assert reads[4] == [], "the update of key 4 carried its whole row"
    assert reads[5] == [], "key 5 was deleted: a read row would bring it back"

    want = {r[0]: {"id": r[0], "v": r[1], "doc": r[2]}
            for r in h.sql(f"SELECT id, v, doc FROM {schema}.t")}  # fmt: skip
    assert len(want) == 199
    assert difference(want, sink_with_fill(events, "t")) == ([], [], [])  # type: ignore[arg-type]

    deadline = time.monotonic() + 60
    while (run := admin.snapshot_status(h.settings)[0])["state"] != "done":
        assert time.monotonic() < deadline, f"the run is not recorded done: {run}"
        time.sleep(0.2)
    (table,) = run["tables"]
    assert table["chunks"] == 6  # five key ranges and the keys read again
    assert table["chunks_done"] == table["chunks"]
