"""What ``stale`` means, on both engines, across a restart of the indexer: only a change
not newer than what the index holds for that row. A change at or below its table's
floor (here a truncate) is skipped but counted apart; a change for a row the index does
not hold, above the floor, is never refused — also after a restart, when the floor is
read back from the index. Events crafted by hand so that versions are chosen."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from shared.kafka import ensure_topic
from tests.integration.conftest import crafted_event as change
from tests.integration.kafka2search.conftest import Indexer, IndexerFactory


def counted(ix: Indexer, name: str) -> float:
    assert ix.service is not None
    value: float = getattr(ix.service.indexer.metrics, name)._value.get()
    return value


def test_stale_counts_only_changes_not_newer_than_the_held_row_after_a_restart(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    topic = f"{unique_name}.cdc"
    t = "accounts"
    first = make_indexer(topic)
    config = first.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    producer = Producer({"bootstrap.servers": first.settings.kafka.bootstrap_servers})

    def send(*values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"")
        producer.flush(10)

    made: list[Indexer] = [first]
    try:
        send(change(t, "insert", 100, 1), change(t, "insert", 100, 2), change(t, "truncate", 200))
        first.start()
        # One partition: the truncate applied means the inserts before it were read.
        first.wait(lambda: first.docs(t) == {} and first.es.resolve_alias(first.alias(t))
                   is not None, "the truncate applied")  # fmt: skip
        first.stop()

        # After a restart: the floor (200) comes back from the index's _meta.
        ix = make_indexer(topic).start()
        made.append(ix)
        send(
            change(t, "insert", 150, 3),  # below the floor, not held: skipped, not stale
            change(t, "insert", 250, 4),  # not held, above the floor: indexed
            change(t, "insert", 210, 5),  # not held, above the floor: indexed
        )
        want: dict[str, dict[str, Any]] = {"4": {"id": 4, "v": 250}, "5": {"id": 5, "v": 210}}
        ix.wait(lambda: ix.docs(t) == want, "rows above the floor indexed")
        ix.wait(lambda: counted(ix, "below_floor") == 1, "the row below the floor")
        assert counted(ix, "stale") == 0, "a row the index does not hold counted stale"
        # One at a time: within a batch only a document's newest change is sent at all.
        for n, (ev, what) in enumerate([
            (change(t, "update", 240, 4), "older than the held 250"),
            (change(t, "insert", 250, 4), "the held version again"),
        ], start=1):  # fmt: skip
            send(ev)
            ix.wait(lambda n=n: counted(ix, "stale") >= n, f"stale: {what}")  # type: ignore[misc]
        send(change(t, "update", 260, 5))  # newer than the held 210: applied
        want["5"] = {"id": 5, "v": 260}
        ix.wait(lambda: ix.docs(t) == want, "the newer change applied")
        assert counted(ix, "stale") == 2
        assert counted(ix, "below_floor") == 1
    finally:
        for one in made:
            one.stop()
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)
