"""Verification marks against the real services (V020, docs/design.md#verification): a
mark asked for with ``_walcast.verify_mark`` reaches every partition of the named table
under primary-key partitioning, after every change committed before it; a table outside
the filters gets none; a mark not signed by walcast (``pg_logical_emit_message`` with the
prefix) is ignored; PUBLIC may not ask for marks, ``walcast_verifier`` may."""

from __future__ import annotations

import json
from typing import Any

from services.pg2kafka import admin
from tests.integration.conftest import HarnessFactory


def marks(events: list[dict[str, Any]], mark_id: str) -> list[dict[str, Any]]:
    return [e for e in events if e["op"] == "verify" and e["verify"]["id"] == mark_id]


def test_a_mark_reaches_every_partition_after_what_committed_before_it(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"vm_{unique_name}"
    q = f'"{schema}"'
    h = make_harness(
        init=False,
        producer={"partition_key": "primary_key"},
        filters={"include": [f"{schema}.kept"]},
        snapshot={"mode": "never", "automatic": False},
    )
    h.sql(f"CREATE SCHEMA {q}")
    h.sql(f"CREATE TABLE {q}.kept (id int PRIMARY KEY, v int)")
    h.sql(f"CREATE TABLE {q}.other (id int PRIMARY KEY)")
    admin.init(h.settings)
    h.start()
    h.sql(f"INSERT INTO {q}.kept SELECT g, g FROM generate_series(1, 30) g")
    # A forged mark first: anyone who may call pg_logical_emit_message could write one.
    h.sql(
        "SELECT pg_logical_emit_message(true, 'walcast.verify', %s)",
        [json.dumps({"id": "forged", "tables": [{"schema": schema, "table": "kept"}]})],
    )
    h.sql(f"SELECT _walcast.verify_mark('m-1', ARRAY['{q}.kept', '{q}.other']::regclass[])")
    partitions = h.settings.producer.topic_partitions
    h.events(lambda evs: len(marks(evs, "m-1")) == partitions, timeout=60)
    got = marks(h.seen, "m-1")
    assert {e["table"] for e in got} == {"kept"}  # "other" is not streamed
    on = {h.partitions[i] for i, e in enumerate(h.seen) if e in got}
    assert on == set(range(partitions))
    # every insert committed before the mark precedes it in its partition
    first_mark = {h.partitions[i]: i for i, e in reversed(list(enumerate(h.seen))) if e in got}
    inserts = [(i, h.partitions[i]) for i, e in enumerate(h.seen)
               if e["op"] == "insert" and e["table"] == "kept"]  # fmt: skip
    assert len(inserts) == 30
    assert all(i < first_mark[p] for i, p in inserts)
    assert marks(h.seen, "forged") == []


def test_only_walcast_verifier_may_ask_for_marks(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    h = make_harness()  # init applied the migrations
    rows = h.sql(
        "SELECT has_function_privilege('walcast_verifier',"
        " '_walcast.verify_mark(text, regclass[])', 'EXECUTE'),"
        " EXISTS (SELECT 1 FROM pg_proc p, aclexplode(p.proacl) a"
        "  WHERE p.oid = '_walcast.verify_mark(text, regclass[])'::regprocedure"
        "  AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'),"
        " (SELECT prosecdef FROM pg_proc"
        "  WHERE oid = '_walcast.verify_mark(text, regclass[])'::regprocedure)"
    )
    assert rows == [(True, False, True)]
