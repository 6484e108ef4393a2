"""kafka2search's documents hold the row hash and transaction of the version they hold
(tests/integration/verify_events.py says what and why)."""

from __future__ import annotations

from typing import Any

from confluent_kafka.admin import AdminClient

from shared.kafka import ensure_topic
from tests.integration.kafka2search.conftest import IndexerFactory
from tests.integration.verify_events import WANT, T, produce


def test_search_documents_hold_the_versions_hash_and_transaction(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.cdc"
    ix = make_indexer(topic)
    ensure_topic(ix.settings.kafka.client_config(), topic, 1, 1)
    try:
        ix.start()
        produce(ix.settings.kafka.bootstrap_servers, topic)
        alias = ix.alias(T)

        def held() -> dict[int, tuple[Any, Any]]:
            if ix.es.resolve_alias(alias) is None:
                return {}
            ix.es.refresh(alias)
            answer = ix.es.request("POST", f"/{alias}/_search", body={
                "size": 100, "docvalue_fields": ["_walcast_hash", "_walcast_xid"],
                "_source": False})  # fmt: skip
            out = {}
            for h in answer["hits"]["hits"]:
                f = h.get("fields", {})
                out[int(h["_id"])] = (f.get("_walcast_hash", [None])[0],
                                      f.get("_walcast_xid", [None])[0])  # fmt: skip
            return out

        ix.wait(lambda: held() == WANT, f"the verify fields held: {WANT}")
        assert ix.broken_stamps(T) == []  # fills and read rows stamped like the rest
        # aggregated by the engine, as verify asks
        answer = ix.es.request("POST", f"/{alias}/_search", body={
            "size": 0, "aggs": {"h": {"sum": {"field": "_walcast_hash"}},
                                "n": {"value_count": {"field": "_walcast_hash"}}}})  # fmt: skip
        assert answer["aggregations"]["h"]["value"] == 12 + 21
        assert answer["aggregations"]["n"]["value"] == 2
        # a reader that leaves them out sees the row alone
        assert ix.docs(T)["1"] == {"id": 1, "v": 120}
    finally:
        ix.stop()  # before its topic goes: it commits on the way out
        client = AdminClient(ix.settings.kafka.client_config())
        client.delete_topics([topic])[topic].result(30)
