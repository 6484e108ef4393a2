"""SearchEngine.bulk against the real engines: what the writer relies on when it skips
the per-item answers (``errors: false``), and the per-item answers when it cannot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.kafka2search.documents import Doc, Origin, bulk_body
from services.kafka2search.engines import SearchEngine, Stored, engine_for
from tests.integration.kafka2search.conftest import search_settings

ORIGIN = Origin("t", 0, 0, None, b"")


def sources(docs: dict[str, Stored]) -> dict[str, dict[str, Any]]:
    return {i: d.source for i, d in docs.items()}


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
    assert sources(engine.mget(alias, ["1", "2"])) == {"1": {"n": 1}, "2": {"n": 20}}


def test_rewrite_field_moves_then_drops_a_column_keeping_versions_and_newer_writes(
    engine_and_alias: tuple[SearchEngine, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renamed / dropped column without server-side scripts (a minimal Elasticsearch 8
    has none): each document rewritten at its own version; a write newer than the read
    wins; a change redelivered at a rewritten document's version is still refused."""
    engine, alias = engine_and_alias
    concrete = f"{alias}-v1"
    engine.put_mapping(concrete, {"m": {"type": "integer"}})
    assert engine.bulk(bulk_body([index(alias, str(i), 10 + i, i) for i in (1, 2, 3)])) is None
    sent = engine.bulk

    def a_newer_write_first(body: bytes, *, require_alias: bool = True) -> object:
        # Document 2 is written again (version 50, already in the new shape) between
        # the rewrite's read and its write.
        newer = Doc(alias, "2", False, 50, {"m": 99}, (), ORIGIN)
        assert sent(bulk_body([newer])) is None
        monkeypatch.setattr(engine, "bulk", sent)
        return sent(body, require_alias=require_alias)

    monkeypatch.setattr(engine, "bulk", a_newer_write_first)
    assert engine.rewrite_field(concrete, "n", "m") == 2
    assert sources(engine.mget(alias, ["1", "2", "3"])) == {
        "1": {"m": 1},
        "2": {"m": 99},
        "3": {"m": 3},
    }
    versions = {i: engine.request("GET", f"/{alias}/_doc/{i}")["_version"] for i in ("1", "2", "3")}
    assert versions == {"1": 11, "2": 50, "3": 13}
    redelivered = engine.bulk(bulk_body([index(alias, "1", 11, 1)]))
    assert redelivered is not None
    assert redelivered[0]["status"] == 409
    assert engine.rewrite_field(concrete, "m", None) == 3
    assert sources(engine.mget(alias, ["1", "2", "3"])) == {"1": {}, "2": {}, "3": {}}
    assert engine.rewrite_field(concrete, "m", None) == 0


def test_rewrite_field_never_brings_back_a_document_deleted_after_the_scroll(
    engine_and_alias: tuple[SearchEngine, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scroll's view may be minutes old: a document deleted since (another
    partition's consumer) is read again before the rewrite and stays deleted."""
    engine, alias = engine_and_alias
    concrete = f"{alias}-v1"
    assert engine.bulk(bulk_body([index(alias, str(i), 10 + i, i) for i in (1, 2)])) is None
    asked = engine.request_raw  # the documents are read whole, as the engine keeps them

    def deleted_meanwhile(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if path.endswith("/_mget"):
            assert engine.bulk(bulk_body([delete(alias, "2", 50)])) is None
            monkeypatch.setattr(engine, "request_raw", asked)
        return asked(method, path, *args, **kwargs)

    monkeypatch.setattr(engine, "request_raw", deleted_meanwhile)
    assert engine.rewrite_field(concrete, "n", "m") == 1
    assert sources(engine.mget(alias, ["1", "2"])) == {"1": {"m": 1}}


def test_rewrite_field_moves_an_unindexed_json_column(
    engine_and_alias: tuple[SearchEngine, str],
) -> None:
    """A json column is mapped without an index (object, enabled: false): an ``exists``
    query never finds it, the rewrite must still move it."""
    engine, alias = engine_and_alias
    concrete = f"{alias}-v1"
    engine.put_mapping(concrete, {"doc": {"type": "object", "enabled": False}})
    body = (
        b'{"index":{"_index":"%b","_id":"1","version":5,"version_type":"external"}}\n'
        % (alias.encode())
        + b'{"n":1,"doc":{"a":[1,2]}}\n'
    )
    assert engine.bulk(body) is None
    assert engine.rewrite_field(concrete, "doc", "body") == 1
    assert sources(engine.mget(alias, ["1"])) == {"1": {"n": 1, "body": {"a": [1, 2]}}}


def test_rewrite_field_renames_and_drops_a_column_a_document_still_lacks(
    engine_and_alias: tuple[SearchEngine, str],
) -> None:
    """A document written without an unchanged TOAST value names the column as unfilled
    (shared.contract.event.fill_unfilled); a rename or a drop of that column rewrites
    the name it waits for, at the document's version — else the older row that carries
    the column under its new name would fill nothing."""
    engine, alias = engine_and_alias
    concrete = f"{alias}-v1"
    waiting = Doc(alias, "1", False, 30, {"k": 1, "_walcast_unfilled": ["n", "o"]}, (), ORIGIN)
    assert engine.bulk(bulk_body([waiting, index(alias, "2", 12, 2)])) is None
    assert engine.rewrite_field(concrete, "n", "m") == 2
    held = engine.mget(alias, ["1", "2"])
    assert held["1"] == Stored(30, {"k": 1, "_walcast_unfilled": ["m", "o"]})
    assert held["2"].source == {"m": 2}
    assert engine.rewrite_field(concrete, "o", None) == 1
    assert engine.rewrite_field(concrete, "m", None) == 2
    assert sources(engine.mget(alias, ["1", "2"])) == {"1": {"k": 1}, "2": {}}
