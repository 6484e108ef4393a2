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
from tests.integration.conftest import crafted_toast as with_toast
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


def test_a_full_row_older_than_a_partial_one_fills_it_after_a_restart(
    make_indexer: IndexerFactory, unique_name: str
) -> None:
    """The partial-row rule (shared.contract.event.fill_unfilled), found by the
    composition suite: an update that left a TOAST value unchanged reaches the index
    before the snapshot's read row of that key, which carries a lower version (below
    changes its content includes). The read row is the only full copy of the row: it
    must fill the held document, not be refused as stale — also when the indexer was
    restarted in between (what it knows is in the document)."""
    topic = f"{unique_name}.cdc"
    t = "docs"
    first = make_indexer(topic)
    config = first.settings.kafka.client_config()
    ensure_topic(config, topic, 1, 1)
    producer = Producer({"bootstrap.servers": first.settings.kafka.bootstrap_servers})
    big = "x" * 5000

    def send(*values: bytes) -> None:
        for value in values:
            producer.produce(topic, value, b"")
        producer.flush(10)

    made: list[Indexer] = [first]
    try:
        first.start()
        send(
            with_toast(change(t, "update", 300, 1), None),
            with_toast(change(t, "update", 300, 2), None),
        )
        first.wait(lambda: len(first.docs(t)) == 2, "the partial rows indexed")
        assert first.docs(t)["1"] == {"id": 1, "v": 300, "_walcast_unfilled": ["big"]}
        first.stop()

        ix = make_indexer(topic).start()
        made.append(ix)
        read = {"id": 1, "chunk": 0}
        send(
            with_toast(change(t, "read", 120, 1, snapshot=read), big),  # older, full: fills
            change(t, "read", 120, 2, snapshot=read),  # older, without `big` either: stale
        )
        ix.wait(lambda: counted(ix, "filled") == 1 and counted(ix, "stale") == 1,
                "the read rows settled")  # fmt: skip
        assert ix.docs(t) == {
            "1": {"id": 1, "v": 300, "big": big},  # the held version's values, filled
            "2": {"id": 2, "v": 300, "_walcast_unfilled": ["big"]},
        }
        # the version stayed: a change between the two is still refused, a newer applied
        send(
            with_toast(change(t, "update", 200, 1), "older"),
            with_toast(change(t, "update", 400, 2), None),
        )
        ix.wait(lambda: counted(ix, "stale") == 2, "the change older than the held one")
        ix.wait(lambda: ix.docs(t)["2"]["v"] == 400, "the newer partial row")
        assert ix.docs(t)["1"]["big"] == big
        assert ix.docs(t)["2"] == {"id": 2, "v": 400, "_walcast_unfilled": ["big"]}
    finally:
        for one in made:
            one.stop()
        client = AdminClient(config)  # must outlive the future
        client.delete_topics([topic])[topic].result(30)
