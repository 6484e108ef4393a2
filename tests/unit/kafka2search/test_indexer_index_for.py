"""kafka2search Indexer.index_for: the index a data event goes to, ready before its data.

It remembers the previous event's table and columns so that a run of one table's events
does no lookups; these tests pin what must still reach the engine.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from services.kafka2search.indexer import Indexer
from services.kafka2search.indices import REGISTRY, forget
from services.kafka2search.metrics import Metrics
from services.kafka2search.settings import IndexSettings
from shared.contract.event import EventView, decode
from shared.errors import PermanentError
from tests.unit.kafka2search.conftest import SettingsFactory, StrictEngine

TYPES = {"id": "int4", "name": "text"}


class NotFoundError(Exception):
    status_code = 404


class IndexEngine(StrictEngine):
    """Indices, aliases and mappings in memory; every call recorded."""

    def __init__(self) -> None:
        self.aliases_: dict[str, str] = {}
        self.mappings: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.registry: set[str] = set()  # the registry index's documents (aliases)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The registry of created aliases (the only raw requests the indexer makes)."""
        assert path.startswith(f"/{REGISTRY}/_doc/"), path
        alias = urllib.parse.unquote(path.rsplit("/", 1)[1])
        if method == "PUT":
            self.registry.add(alias)
            return {}
        if alias not in self.registry:
            raise NotFoundError()
        if method == "DELETE":
            self.registry.discard(alias)
        return {"found": True}

    def resolve_alias(self, alias: str) -> str | None:
        return self.aliases_.get(alias)

    def create_index(
        self,
        index: str,
        alias: str,
        settings: IndexSettings,
        properties: dict[str, Any],
        meta: dict[str, Any],
    ) -> bool:
        self.calls.append(f"create {index}")
        self.aliases_[alias] = index
        self.mappings[index] = dict(properties)
        return True

    def put_mapping(
        self, index: str, properties: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> None:
        self.calls.append(f"map {index} {sorted(properties)}")
        self.mappings[index].update(properties)

    def rewrite_field(self, index: str, field: str, to: str | None) -> int:
        self.calls.append(f"rewrite {index} {field} {to}")
        return 0

    def delete_index(self, index: str) -> None:
        self.calls.append(f"delete {index}")
        self.aliases_ = {a: i for a, i in self.aliases_.items() if i != index}
        del self.mappings[index]


def data(table: str = "users", types: dict[str, str] = TYPES, schema: str = "public") -> EventView:
    value = {"v": 1, "op": "insert", "db": "app", "schema": schema, "table": table, "lsn": 1}
    return decode(orjson.dumps({**value, "key": {"id": 1}, "new": {"id": 1}, "types": types}))


def ddl(table: str, **fields: Any) -> EventView:
    value = {"v": 1, "op": "ddl", "db": "app", "schema": "public", "table": table, "lsn": 2}
    return decode(orjson.dumps({**value, "ddl": {"tag": "DROP TABLE", **fields}}))


def make(settings_with: SettingsFactory, **index: Any) -> tuple[Indexer, IndexEngine]:
    engine = IndexEngine()
    settings = settings_with(index={"name_template": "w-{schema}.{table}", **index})
    indexer = Indexer(settings, engine, Metrics(CollectorRegistry()), lambda _: None)
    return indexer, engine


def test_a_run_of_one_tables_events_opens_its_index_once(settings_with: SettingsFactory) -> None:
    indexer, engine = make(settings_with)
    assert {indexer.index_for(data()) for _ in range(3)} == {"w-public.users"}
    assert engine.calls == ["create w-public.users-v1"]


def test_a_run_of_one_tables_events_is_not_looked_up_again(
    settings_with: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    indexer, _engine = make(settings_with)
    lookups: list[str] = []
    alias_for = indexer.indices.alias_for

    def counted(ev: EventView) -> str:
        lookups.append(f"{ev.schema}.{ev.table}")
        return alias_for(ev)

    monkeypatch.setattr(indexer.indices, "alias_for", counted)
    for _ in range(3):
        indexer.index_for(data())
    assert lookups == ["public.users"]


def test_the_same_table_name_in_another_schema_is_another_index(
    settings_with: SettingsFactory,
) -> None:
    indexer, engine = make(settings_with)
    assert indexer.index_for(data()) == "w-public.users"
    assert indexer.index_for(data(schema="audit")) == "w-audit.users"
    assert engine.calls == ["create w-public.users-v1", "create w-audit.users-v1"]


def test_events_alternating_between_tables_go_to_their_own_indices(
    settings_with: SettingsFactory,
) -> None:
    indexer, engine = make(settings_with)
    got = [indexer.index_for(data(t)) for t in ("users", "orders", "users", "orders")]
    assert got == ["w-public.users", "w-public.orders", "w-public.users", "w-public.orders"]
    assert engine.calls == ["create w-public.users-v1", "create w-public.orders-v1"]


def test_a_new_column_is_mapped_before_the_event_that_carries_it(
    settings_with: SettingsFactory,
) -> None:
    indexer, engine = make(settings_with)
    indexer.index_for(data())
    indexer.index_for(data(types={**TYPES, "age": "int4"}))
    assert engine.calls[-1] == "map w-public.users-v1 ['age']"
    assert "age" in engine.mappings["w-public.users-v1"]


def test_a_table_dropped_and_created_again_gets_its_index_back(
    settings_with: SettingsFactory,
) -> None:
    # The same table name and columns before and after: only the drop tells them apart.
    indexer, engine = make(settings_with, on_drop_table="delete")
    indexer.index_for(data())
    indexer.ddl(ddl("users", dropped=True))
    assert indexer.index_for(data()) == "w-public.users"
    assert engine.calls == [
        "create w-public.users-v1",
        "delete w-public.users-v1",
        "create w-public.users-v1",
    ]
    assert "w-public.users" in indexer.states  # Indexer.write looks the index up there


def test_a_column_dropped_and_added_again_is_mapped_again(
    settings_with: SettingsFactory,
) -> None:
    # Events before the drop and after the re-add carry the same types object.
    indexer, engine = make(settings_with)
    indexer.index_for(data())
    columns = [{"name": "id", "type": "int4"}]
    indexer.ddl(
        ddl("users", tag="ALTER TABLE", statement="ALTER TABLE users DROP name", columns=columns)
    )
    assert "name" not in indexer.states["w-public.users"].columns
    indexer.index_for(data())
    assert indexer.states["w-public.users"].columns == TYPES
    assert engine.calls[-1] == "map w-public.users-v1 ['name']"


def test_an_index_deleted_outside_walcast_is_never_created_again_empty(
    settings_with: SettingsFactory,
) -> None:
    """Before: a restart created the alias again, empty, and went on: a silently partial
    copy. The registry says the alias existed: the service stops with what to do."""
    indexer, engine = make(settings_with)
    indexer.index_for(data())
    assert engine.registry == {"w-public.users"}
    engine.aliases_.clear()  # deleted by someone else
    settings = settings_with(index={"name_template": "w-{schema}.{table}"})
    fresh = Indexer(settings, engine, Metrics(CollectorRegistry()), lambda _: None)  # a restart
    with pytest.raises(PermanentError, match="deleted outside walcast") as err:
        fresh.index_for(data())
    assert "kafka2search forget --alias w-public.users" in str(err.value)
    assert forget(engine, "w-public.users")
    assert fresh.index_for(data()) == "w-public.users"  # the operator's choice: start over
