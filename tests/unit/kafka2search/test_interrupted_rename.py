"""A column rename interrupted between mapping the new field and moving the values (a
kill of kafka2search, the engine gone): the DDL event, delivered again to a restarted
indexer, is still a rename — the values move — never a drop that erases them (found by
bench/composition.py, seeds 1825526231 and 411894510)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from services.kafka2search.indexer import Indexer
from services.kafka2search.metrics import Metrics
from services.kafka2search.settings import IndexSettings
from shared.contract.event import EventView, decode
from shared.errors import PermanentError
from tests.unit.kafka2search.conftest import SettingsFactory
from tests.unit.kafka2search.test_indexer_index_for import IndexEngine


class MetaEngine(IndexEngine):
    """Keeps each index's ``_meta``, as the engines do; the first rename can crash."""

    def __init__(self) -> None:
        super().__init__()
        self.metas: dict[str, dict[str, Any]] = {}
        self.crash_on_rename = False

    def create_index(
        self,
        index: str,
        alias: str,
        settings: IndexSettings,
        properties: dict[str, Any],
        meta: dict[str, Any],
    ) -> bool:
        self.metas[index] = meta
        return super().create_index(index, alias, settings, properties, meta)

    def put_mapping(
        self, index: str, properties: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> None:
        if meta is not None:
            self.metas[index] = orjson.loads(orjson.dumps(meta))
        super().put_mapping(index, properties, meta)

    def mapping(self, index: str) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.mappings[index], self.metas[index]

    def rewrite_field(self, index: str, field: str, to: str | None) -> int:
        if to is not None and self.crash_on_rename:
            self.crash_on_rename = False
            raise PermanentError("killed while moving the values")
        return super().rewrite_field(index, field, to)


def alter(columns: list[tuple[str, str, int]], statement: str, lsn: int = 5) -> EventView:
    ev = {"v": 1, "op": "ddl", "db": "app", "schema": "public", "table": "users", "lsn": lsn,
          "ddl": {"tag": "ALTER TABLE", "statement": statement,
                  "columns": [{"name": n, "type": t, "num": num} for n, t, num in columns],
                  "primary_key": ["id"]}}  # fmt: skip
    return decode(orjson.dumps(ev))


def indexer(settings_with: SettingsFactory, engine: MetaEngine) -> Indexer:
    settings = settings_with(index={"name_template": "w-{schema}.{table}"})
    return Indexer(settings, engine, Metrics(CollectorRegistry()), lambda _: None)


def test_an_interrupted_rename_is_a_rename_again_after_a_restart(
    settings_with: SettingsFactory,
) -> None:
    engine = MetaEngine()
    first = indexer(settings_with, engine)
    first.ddl(alter([("id", "int4", 1), ("note", "text", 2)], "ALTER TABLE users ADD note text"))
    rename = alter([("id", "int4", 1), ("remark", "text", 2)],
                   "ALTER TABLE users RENAME note TO remark", lsn=9)  # fmt: skip
    engine.crash_on_rename = True
    with pytest.raises(PermanentError, match="killed"):
        first.ddl(rename)  # the process dies here; the event was not committed
    engine.calls.clear()
    second = indexer(settings_with, engine)  # restarted: state from the index's _meta
    second.ddl(rename)
    rewrites = [c for c in engine.calls if c.startswith("rewrite")]
    assert rewrites == ["rewrite w-public.users-v1 note remark"], engine.calls
