"""Which control events cut a table's rows into segments (one MERGE each), and the copies
of one table-wide event that primary-key partitioning puts in every partition."""

from __future__ import annotations

from typing import Any

from services.kafka2spark.plan import Control, cuts, distinct

IDS = {"db": "d", "schema": "public", "table": "t"}


def ctl(op: str, lsn: int, seq: int = 0, **kw: Any) -> Control:
    return Control("d.public.t", lsn, seq, op, kw.get("ddl"), IDS, kw.get("snapshot"))


def test_copies_of_one_event_collapse_and_different_events_at_one_position_stay() -> None:
    start = ctl("snapshot", 100, snapshot={"id": 7, "phase": "start"})
    end = ctl("snapshot", 100, snapshot={"id": 7, "phase": "end", "rows": 3})
    add = ctl("ddl", 200, ddl={"tag": "ALTER TABLE", "columns": [{"name": "a"}]})
    copies = [start, end, start, end, add, ctl("ddl", 200, ddl=dict(add.ddl or {}))]
    assert list(distinct(copies)) == [start, end, add]
    # the same DDL at another position is another event
    again = ctl("ddl", 300, ddl=dict(add.ddl or {}))
    assert list(distinct([add, again])) == [add, again]


def test_only_events_that_change_the_mirror_cut_segments() -> None:
    assert cuts(ctl("truncate", 1))
    assert cuts(ctl("snapshot", 1, snapshot={"id": 1, "phase": "end"}))
    assert not cuts(ctl("snapshot", 1, snapshot={"id": 1, "phase": "start"}))
    assert cuts(ctl("ddl", 1, ddl={"tag": "CREATE TABLE", "columns": [{"name": "a"}]}))
    assert not cuts(ctl("ddl", 1, ddl={"tag": "DROP TABLE", "dropped": True}))
