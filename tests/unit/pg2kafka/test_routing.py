"""Where a table's events go (services/pg2kafka/routing.py): the Kafka key per
``producer.partition_key``, and the one rule for events that concern every row of a
table (a truncate, a schema change, a snapshot marker), which the stream and the
snapshots both follow."""

from __future__ import annotations

from typing import Any

import pytest

from services.pg2kafka.routing import Routing, row_key, table_key
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.topics import StreamTarget
from shared.settings import load_settings


def routing(mode: str) -> Routing:
    s = load_settings(
        Pg2KafkaSettings, env_file=None, http={"enabled": False}, producer={"partition_key": mode}
    )
    return Routing(s, StreamTarget.cdc(s), lambda _topic: 6)


def ev(**kw: Any) -> Any:
    return {"schema": "app", "table": "orders", "key": {"id": 7}, **kw}


def test_table_wide_events_go_to_every_partition_under_primary_key_keys() -> None:
    asked: list[int] = []

    def partitions() -> int:
        asked.append(1)
        return 3

    r = routing("primary_key")
    assert r.table_wide("app", "orders", partitions) == [
        (table_key("app", "orders"), 0),
        (table_key("app", "orders"), 1),
        (table_key("app", "orders"), 2),
    ]
    assert asked == [1]  # asked once per event: partitions may have been added
    assert r.key(ev()) == row_key("app", "orders", {"id": 7})


@pytest.mark.parametrize(("mode", "key"), [("table", b"app.orders"), ("schema", b"app")])
def test_table_wide_events_go_by_the_tables_key_otherwise(mode: str, key: bytes) -> None:
    r = routing(mode)

    def never() -> int:
        raise AssertionError("no partition count needed")

    assert r.table_wide("app", "orders", never) is None
    assert r.key(ev()) == key
