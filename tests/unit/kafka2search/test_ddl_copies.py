"""Schema changes under primary-key partitioning: every partition carries a copy of each
DDL event, and a consumer of several partitions meets copies of older changes after newer
ones. Each is applied once, and never one older than the last applied — an older copy
applied late reverted the schema: a renamed column renamed back and its values cleared
(found by ``bench/composition.py --seed 1112186381``: 43 documents without their renamed
column's value in OpenSearch)."""

from __future__ import annotations

import orjson
from prometheus_client import CollectorRegistry

from services.kafka2search.indexer import Indexer
from services.kafka2search.metrics import Metrics
from shared.contract.event import EventView, decode
from tests.unit.kafka2search.conftest import SettingsFactory
from tests.unit.kafka2search.test_interrupted_rename import MetaEngine, alter, indexer


class RecreatingEngine(MetaEngine):
    def delete_older(self, index: str, version: int, *, reopen: bool = False) -> int:
        self.calls.append(f"delete_older {index} {version}")
        return 0


ADD = [("id", "int4", 1), ("note", "text", 2)]
RENAMED = [("id", "int4", 1), ("remark", "text", 2)]


def test_an_older_copy_after_a_newer_change_is_skipped_even_after_a_restart(
    settings_with: SettingsFactory,
) -> None:
    engine = MetaEngine()
    first = indexer(settings_with, engine)
    add = alter(ADD, "ALTER TABLE users ADD note text", lsn=5)
    rename = alter(RENAMED, "ALTER TABLE users RENAME note TO remark", lsn=9)
    first.ddl(add)  # partition 0: both changes
    first.ddl(rename)
    assert [c for c in engine.calls if c.startswith("rewrite")] == [
        "rewrite w-public.users-v1 note remark"
    ]
    engine.calls.clear()
    first.ddl(add)  # partition 1's copies, late
    first.ddl(rename)
    assert [c for c in engine.calls if c.startswith(("rewrite", "map"))] == []
    assert set(first.states["w-public.users"].columns) == {"id", "remark"}
    second = indexer(settings_with, engine)  # restarted: the version from the _meta
    second.ddl(add)
    assert [c for c in engine.calls if c.startswith(("rewrite", "map"))] == []
    assert engine.metas["w-public.users-v1"]["walcast"]["schema_at"] == 9


def _drop(lsn: int) -> EventView:
    ev = {"v": 1, "op": "ddl", "db": "app", "schema": "public", "table": "users", "lsn": lsn,
          "ddl": {"tag": "DROP TABLE", "dropped": True}}  # fmt: skip
    return decode(orjson.dumps(ev))


def _create(lsn: int) -> EventView:
    ev = {"v": 1, "op": "ddl", "db": "app", "schema": "public", "table": "users", "lsn": lsn,
          "ddl": {"tag": "CREATE TABLE", "statement": "CREATE TABLE users (id int4)",
                  "columns": [{"name": "id", "type": "int4", "num": 1}],
                  "primary_key": ["id"]}}  # fmt: skip
    return decode(orjson.dumps(ev))


def _indexer(settings_with: SettingsFactory, engine: MetaEngine, on_drop_table: str) -> Indexer:
    settings = settings_with(
        index={"name_template": "w-{schema}.{table}", "on_drop_table": on_drop_table}
    )
    return Indexer(settings, engine, Metrics(CollectorRegistry()), lambda _: None)


def test_a_late_copy_of_a_drop_never_deletes_the_table_created_again(
    settings_with: SettingsFactory,
) -> None:
    engine = RecreatingEngine()
    ix = _indexer(settings_with, engine, "delete")
    ix.ddl(_create(3))
    ix.ddl(_drop(15))  # partition 0: dropped, then created again
    ix.ddl(_create(20))
    created = engine.resolve_alias("w-public.users")
    assert created is not None
    engine.calls.clear()
    ix.ddl(_drop(15))  # partition 1's copy of the drop, late
    ix.ddl(_create(20))  # and of the creation
    assert engine.resolve_alias("w-public.users") == created
    assert [c for c in engine.calls if c.startswith(("delete", "create"))] == []


def test_a_late_copy_of_a_drop_is_skipped_when_the_index_is_retained(
    settings_with: SettingsFactory,
) -> None:
    engine = RecreatingEngine()
    ix = _indexer(settings_with, engine, "retain")
    ix.ddl(_create(3))
    ix.ddl(_drop(15))
    index = engine.resolve_alias("w-public.users")
    assert index is not None
    assert engine.metas[index]["walcast"]["schema_at"] == 15
    drops = ix.metrics.schema_changes.labels("drop_table")._value.get()
    ix.ddl(_drop(15))  # another partition's copy
    assert ix.metrics.schema_changes.labels("drop_table")._value.get() == drops


def test_a_table_created_again_starts_without_the_old_ones_moves(
    settings_with: SettingsFactory,
) -> None:
    engine = RecreatingEngine()
    ix = _indexer(settings_with, engine, "retain")
    ix.ddl(_create(3))
    ix.ddl(alter(ADD, "ALTER TABLE users ADD note text", lsn=5))
    ix.ddl(alter(RENAMED, "ALTER TABLE users RENAME note TO remark", lsn=9))
    st = ix.states["w-public.users"]
    assert st.meta["moves"] == [["note", "remark", 9]]
    ix.ddl(_drop(15))
    ix.ddl(_create(20))  # the new table's column 2, were it there, is no rename of "remark"
    assert "moves" not in st.meta
    assert st.meta["numbers"] == {"id": 1}
    assert set(st.columns) == {"id"}
