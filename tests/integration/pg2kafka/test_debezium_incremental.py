"""Incremental snapshots in pg2kafka's ``debezium`` format, against Postgres and Kafka: a
snapshot of key ranges (what a sink's ``repair`` asks for) and one of a whole table (``pg2kafka
snapshot``) write the rows as the connector's ``r`` records of an incremental snapshot
(``source.snapshot = incremental``), then the table's end as an ``m`` record carrying
walcast's ``snapshot`` block in ``source.walcast_snapshot`` — after every row of the run
on the partition — which the sinks' reader turns into walcast's end marker
(docs/events.md)."""

from __future__ import annotations

import json
from typing import Any

from services.pg2kafka import admin
from services.pg2kafka.snapshots.initial import after_source_change
from shared.contract.event import decode
from shared.formats.debezium_input import events
from tests import debezium
from tests.integration.conftest import HarnessFactory


def reads(records: list[tuple[Any, Any]]) -> list[int]:
    return [v["payload"]["after"]["id"] for _k, v in records
            if v is not None and v["payload"]["op"] == "r"]  # fmt: skip


def ends(records: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    return [v for _k, v in records if v is not None and v["payload"]["op"] == "m"]


def test_incremental_snapshots_are_written_as_r_records_and_an_m_end_record(
    make_harness: HarnessFactory, stack_env: dict[str, str], unique_name: str
) -> None:
    schema = f"di_{unique_name}"
    prefix = f"{unique_name}_p"
    q = f'"{schema}"'
    h = make_harness(
        init=False,
        filters={"include": [f"{schema}.*"]},
        producer={"format": "debezium", "create_topic": True, "topic_partitions": 1},
        debezium={"topic_prefix": prefix},
        snapshot={"mode": "never", "chunk_rows": 4},  # automatic: allowed in this format
    )
    h.sql(f"CREATE SCHEMA {q}")
    h.sql(f"CREATE TABLE {q}.t (id int PRIMARY KEY, v text)")
    h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g FROM generate_series(1, 40) g")
    admin.init(h.settings)
    h.start()
    h.sql(f"SELECT _walcast.request_repair('{q}.t', %s::jsonb)", [json.dumps([[[10], [20]]])])
    topic = f"{prefix}.{schema}.t"
    got = debezium.read_topic(stack_env, topic, lambda rs: len(ends(rs)) >= 1, "a range's end")
    assert sorted(reads(got)) == list(range(11, 21))  # each once, none outside the range
    (end,) = ends(got)
    assert got[-1][1] is end  # after every row of the run
    source = end["payload"]["source"]
    info = json.loads(source["walcast_snapshot"])
    assert info["phase"] == "range_end"
    assert info["key_ranges"] == {"columns": ["id"], "ranges": [[[10], [20]]]}
    for _k, v in got:
        if v["payload"]["op"] == "r":
            assert v["payload"]["source"]["snapshot"] == "incremental"
            assert v["payload"]["source"]["lsn"] > source["lsn"]  # above the run's start
    (marker,) = events(None, json.dumps(end).encode())
    decode(json.dumps(marker).encode())  # the event contract takes it
    assert (marker["op"], marker["lsn"]) == ("snapshot", source["lsn"])

    # a whole table, on request: its end marker is the table's (phase end)
    (run,) = admin.snapshot_request(h.settings, [f"{schema}.t"])
    assert run > 0
    got = debezium.read_topic(stack_env, topic, lambda rs: len(ends(rs)) >= 2, "a table's end")
    whole = [v for _k, v in got[got.index((None, end)) + 1 :] if v is not None]
    assert sorted(v["payload"]["after"]["id"] for v in whole if v["payload"]["op"] == "r") == list(
        range(1, 41)
    )
    last = json.loads(whole[-1]["payload"]["source"]["walcast_snapshot"])
    assert (last["phase"], last["rows"]) == ("end", 40)


def test_after_a_source_change_no_snapshot_is_asked_for_and_the_log_says_why(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    """This format carries no source epoch: snapshots of the new source could not outrank
    the old source's rows at higher positions, so none is filed, and the message says
    what to do instead."""
    schema = f"ds_{unique_name}"
    h = make_harness(
        init=False,
        filters={"include": [f"{schema}.*"]},
        producer={"format": "debezium", "create_topic": True, "topic_partitions": 1},
        debezium={"topic_prefix": f"{unique_name}_p"},
        snapshot={"mode": "initial"},
    )
    h.sql(f'CREATE SCHEMA "{schema}"')
    h.sql(f'CREATE TABLE "{schema}".t (id int PRIMARY KEY)')
    admin.init(h.settings)
    h.start()  # the slot made (it came along with the new source)
    h.stop()
    said = after_source_change(h.settings, "a test")
    assert "carries no source epoch" in said, said
    assert "tear-down" in said, said
    assert h.sql(
        "SELECT count(*) FROM _walcast.snapshot_requests WHERE publication = %s",
        [h.settings.replication.publication],
    ) == [(0,)]
