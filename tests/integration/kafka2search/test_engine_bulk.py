"""SearchEngine.bulk against the real engines: what the writer relies on when it skips
the per-item answers (``errors: false``), and the per-item answers when it cannot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.kafka2search.documents import Doc, Origin, bulk_body
from services.kafka2search.engines import SearchEngine, engine_for
from tests.integration.kafka2search.conftest import search_settings

ORIGIN = Origin("t", 0, 0, None, b"")


@pytest.fixture
def engine_and_alias(
    env_file: Path, stack_env: dict[str, str], unique_name: str, engine_kind: str
) -> Iterator[tuple[SearchEngine, str]]:
    name = unique_name.replace("_", "-")
    settings = search_settings(env_file, stack_env, engine_kind, name, "unused")
    engine = engine_for(settings.engine)
    alias = f"{name}-bulk"
    engine.create_index(f"{alias}-v1", alias, settings.index, {"n": {"type": "integer"}}, {})
    try:
        yield engine, alias
    finally:
        engine.delete_index(f"{alias}-v1")
        engine.close()


def index(alias: str, id_: str, lsn: int, n: int) -> Doc:
    return Doc(alias, id_, False, lsn, {"n": n}, (), ORIGIN)


def delete(alias: str, id_: str, lsn: int) -> Doc:
    return Doc(alias, id_, True, lsn, None, (), ORIGIN)


def test_no_per_item_answer_when_every_action_succeeded(
    engine_and_alias: tuple[SearchEngine, str],
) -> None:
    engine, alias = engine_and_alias
    # A delete of a document that does not exist is no error (404, not_found) either.
    docs = [index(alias, "1", 10, 1), index(alias, "2", 10, 2), delete(alias, "3", 10)]
    assert engine.bulk(bulk_body(docs)) is None
    engine.refresh(alias)
    assert engine.count(alias) == 2


def test_per_item_answers_in_order_when_one_action_failed(
    engine_and_alias: tuple[SearchEngine, str],
) -> None:
    engine, alias = engine_and_alias
    assert engine.bulk(bulk_body([index(alias, "1", 10, 1), index(alias, "2", 10, 2)])) is None
    # An older version of 1 (refused: 409), a newer one of 2, a delete of a missing 3.
    docs = [index(alias, "1", 5, 0), index(alias, "2", 20, 20), delete(alias, "3", 20)]
    results = engine.bulk(bulk_body(docs))
    assert results is not None
    assert [r["status"] for r in results] == [409, 200, 404]
    assert "version_conflict" in results[0]["error"]["type"]
    engine.refresh(alias)
    assert engine.mget(alias, ["1", "2"]) == {"1": {"n": 1}, "2": {"n": 20}}
