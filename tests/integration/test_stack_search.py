"""Both search engines answer, and external versioning behaves as the sinks will rely on."""

from __future__ import annotations

import elasticsearch
import opensearchpy
import pytest


@pytest.fixture(params=["opensearch", "elasticsearch"])
def engine(request: pytest.FixtureRequest, stack_env: dict[str, str]) -> object:
    if request.param == "opensearch":
        return opensearchpy.OpenSearch(stack_env["WALCAST_OPENSEARCH_URL"], timeout=30)
    return elasticsearch.Elasticsearch(stack_env["WALCAST_ELASTICSEARCH_URL"], request_timeout=30)


def test_index_with_external_version(engine: object, unique_name: str) -> None:
    client = engine  # both clients share this API shape
    index = unique_name.lower()
    client.indices.create(index=index)  # type: ignore[attr-defined]
    try:
        client.index(
            index=index,
            id="1",
            body={"n": 2},
            version=20,
            version_type="external",  # type: ignore[attr-defined]
            refresh=True,
        )
        conflict = (opensearchpy.ConflictError, elasticsearch.ConflictError)
        with pytest.raises(conflict):
            client.index(
                index=index,
                id="1",
                body={"n": 1},
                version=10,  # type: ignore[attr-defined]
                version_type="external",
            )
        doc = client.get(index=index, id="1")  # type: ignore[attr-defined]
        assert doc["_source"] == {"n": 2}
        assert doc["_version"] == 20
        health = client.cluster.health()  # type: ignore[attr-defined]
        assert health["status"] in ("green", "yellow")
    finally:
        client.indices.delete(index=index)  # type: ignore[attr-defined]
