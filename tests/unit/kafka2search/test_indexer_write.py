"""kafka2search Indexer.write: bulk outcomes, per-item retries, truncates and TOAST fills."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from services.kafka2search.documents import Batch, Doc, Origin
from services.kafka2search.engines import Stored
from services.kafka2search.indexer import Indexer
from services.kafka2search.indices import IndexState
from services.kafka2search.mapping import ROW_BODY
from services.kafka2search.metrics import Metrics
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.stamps import body_intact
from shared.contract.event import ROW_HASH, ROW_XID, decode
from shared.errors import RetriableError
from shared.interfaces import Rejection
from tests.unit.kafka2search.conftest import SettingsFactory, StrictEngine

ALIAS = "walcast-public.users"
OTHER = "walcast-public.orders"
ERROR_400 = {"type": "mapper_parsing_exception", "reason": "failed to parse field [age]"}

# One bulk answer: per document id, the item's status (or the whole item result); ids
# not named are written (201 for index, 200 for delete). An exception is raised instead.
Answer = dict[str, int | dict[str, Any]] | Exception


class FakeEngine(StrictEngine):
    """The two calls Indexer.write makes, answered from a script and recorded."""

    def __init__(
        self,
        answers: Iterable[Answer] = (),
        stored: dict[str, dict[str, dict[str, Any]]] | None = None,
        log: list[str] | None = None,
    ) -> None:
        self.answers: deque[Answer] = deque(answers)
        self.stored = stored or {}
        self.versions: dict[str, dict[str, int]] = {}  # of stored documents (else 1)
        self.mget_failures: deque[Exception] = deque()
        self.bulks: list[list[tuple[str, dict[str, Any], dict[str, Any] | None]]] = []
        self.mgets: list[tuple[str, list[str]]] = []
        self.verify_fields: dict[str, dict[str, int]] = {}
        self.log = log if log is not None else []

    def bulk(self, ndjson: bytes, *, require_alias: bool = True) -> list[dict[str, Any]] | None:
        self.log.append("bulk")
        assert ndjson.endswith(b"\n")
        lines = ndjson.splitlines()
        rows = [orjson.loads(line) for line in lines]
        actions: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = []
        i = 0
        while i < len(rows):
            ((action, meta),) = rows[i].items()
            source = None
            if action == "index":
                source = rows[i + 1]
                # every document written is stamped, its stamp true to what follows it
                assert body_intact(lines[i + 1]) is (True if ROW_XID in source else None)
                # verify's fields apart: the tests here look at the row
                # (tests/unit/kafka2search/test_documents.py looks at them)
                self.verify_fields[meta["_id"]] = {
                    k: source.pop(k) for k in (ROW_HASH, ROW_XID, ROW_BODY) if k in source
                }
                i += 1
            actions.append((action, meta, source))
            i += 1
        self.bulks.append(actions)
        answer = self.answers.popleft() if self.answers else {}
        if isinstance(answer, Exception):
            raise answer
        results: list[dict[str, Any]] = []
        for action, meta, _source in actions:
            planned = answer.get(meta["_id"], 200 if action == "delete" else 201)
            if isinstance(planned, dict):
                results.append(planned)
            elif planned >= 400:
                results.append({"status": planned, "error": {"type": f"status_{planned}"}})
            else:
                results.append({"status": planned})
        failed = [
            r
            for (action, _, _), r in zip(actions, results, strict=True)
            if not (200 <= r["status"] < 300 or (action == "delete" and r["status"] == 404))
        ]
        return results if failed else None  # the engines' "errors": false

    def mget(
        self, index: str, ids: list[str], fields: list[str] | None = None
    ) -> dict[str, Stored]:
        self.log.append("mget")
        self.mgets.append((index, list(ids)))
        if self.mget_failures:
            raise self.mget_failures.popleft()
        docs = self.stored.get(index, {})
        versions = self.versions.get(index, {})
        return {
            i: Stored(
                versions.get(i, 1),
                {k: v for k, v in docs[i].items() if fields is None or k in fields},
            )
            for i in ids
            if i in docs
        }

    def sent(self, n: int = 0) -> list[tuple[str, str, int]]:
        """(action, id, version) of bulk request ``n``."""
        return [(a, m["_id"], m["version"]) for a, m, _ in self.bulks[n]]

    def source(self, doc_id: str, n: int = 0) -> dict[str, Any] | None:
        return next(s for _, m, s in self.bulks[n] if m["_id"] == doc_id)


@pytest.fixture
def settings(settings_with: SettingsFactory) -> Kafka2SearchSettings:
    return settings_with(retry={"initial_s": 0.01, "max_s": 0.04, "multiplier": 2.0, "jitter": 0.0})


@dataclass
class Harness:
    indexer: Indexer
    engine: FakeEngine
    registry: CollectorRegistry
    log: list[str]
    sleeps: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)

    def sleep(self, seconds: float) -> None:
        self.log.append(f"sleep {seconds}")
        self.sleeps.append(seconds)

    def write(
        self, batch: Batch, before: tuple[Future[list[Rejection]], ...] = ()
    ) -> list[Rejection]:
        return self.indexer.write(batch, self.sleep, before)

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(f"walcast_kafka2search_{name}", labels)
        return 0.0 if value is None else value


MakeHarness = Callable[..., Harness]


@pytest.fixture
def make(settings: Kafka2SearchSettings) -> MakeHarness:
    def factory(
        answers: Iterable[Answer] = (),
        stored: dict[str, dict[str, dict[str, Any]]] | None = None,
        truncated_lsn: int = 0,
    ) -> Harness:
        log: list[str] = []
        engine = FakeEngine(answers, stored, log)
        registry = CollectorRegistry()
        waits: list[float] = []
        indexer = Indexer(settings, engine, Metrics(registry), waits.append)
        for alias in (ALIAS, OTHER):
            indexer.states[alias] = IndexState(
                alias, f"{alias}-v1", {"id": "int4", "name": "text", "bio": "text"}, truncated_lsn
            )
        return Harness(indexer, engine, registry, log, waits=waits)

    return factory


_offsets = iter(range(1_000_000))


def change(op: str, id_: int, lsn: int, **fields: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "v": 1,
        "op": op,
        "db": "app",
        "schema": "public",
        "table": "users",
        "lsn": lsn,
        "key": {"id": id_},
        "types": {"id": "int4", "name": "text", "bio": "text"},
    }
    if op != "delete":
        ev["new"] = {"id": id_, "name": f"n{id_}@{lsn}"}
    ev.update(fields)
    return ev


def batch_of(*events: dict[str, Any], index: str = ALIAS) -> Batch:
    b = Batch()
    for ev in events:
        value = orjson.dumps(ev)
        origin = Origin("walcast.cdc", 0, next(_offsets), None, value)
        assert b.add(index, decode(value), origin) is None
    return b


def failed_future() -> Future[list[Rejection]]:
    f: Future[list[Rejection]] = Future()
    f.set_exception(RetriableError("bulk write failed"))
    return f


def done_future() -> Future[list[Rejection]]:
    f: Future[list[Rejection]] = Future()
    f.set_result([])
    return f


# -- outcomes of one bulk ---------------------------------------------------------------


def test_all_written_returns_no_rejections_and_counts_documents(make: MakeHarness) -> None:
    h = make()
    batch = batch_of(change("insert", 1, 10), change("insert", 2, 11), change("delete", 3, 12))
    assert h.write(batch) == []
    assert h.engine.sent() == [("index", "1", 10), ("index", "2", 11), ("delete", "3", 12)]
    assert h.engine.source("1") == {"id": 1, "name": "n1@10"}
    assert h.metric("documents_total", action="index") == 2
    assert h.metric("documents_total", action="delete") == 1
    assert h.metric("stale_events_total") == 0
    assert h.metric("bulk_seconds_count") == 1
    assert h.sleeps == []
    assert h.waits == []  # the writer's own sleep is used, never the consumer's wait
    assert h.engine.mgets == []


def test_bulk_sends_only_the_newest_change_of_each_document(make: MakeHarness) -> None:
    h = make()
    batch = batch_of(change("insert", 1, 10), change("update", 1, 20), change("delete", 1, 30))
    h.write(batch)
    assert h.engine.sent() == [("delete", "1", 30)]
    assert h.metric("documents_total", action="delete") == 1
    assert h.metric("documents_total", action="index") == 0


def test_version_conflict_is_counted_stale_not_rejected(make: MakeHarness) -> None:
    h = make([{"1": 409}])
    batch = batch_of(change("update", 1, 10), change("update", 2, 11))
    assert h.write(batch) == []
    assert h.metric("stale_events_total") == 1
    assert h.metric("documents_total", action="index") == 1
    assert len(h.engine.bulks) == 1  # a conflict is final, never resent


def test_delete_of_a_missing_document_is_fine(make: MakeHarness) -> None:
    h = make([{"1": 404}])
    assert h.write(batch_of(change("delete", 1, 10))) == []
    assert h.metric("documents_total", action="delete") == 1
    assert len(h.engine.bulks) == 1


def test_index_answered_404_is_rejected(make: MakeHarness) -> None:
    h = make([{"1": 404}])
    rejected = h.write(batch_of(change("insert", 1, 10)))
    assert len(rejected) == 1
    assert "(404)" in rejected[0][1]


def test_mapper_error_is_returned_as_a_rejection_with_status_and_reason(make: MakeHarness) -> None:
    h = make([{"2": {"status": 400, "error": ERROR_400}}])
    batch = batch_of(change("insert", 1, 10), change("insert", 2, 11))
    origin_2 = batch.docs[(ALIAS, "2")].origin
    rejected = h.write(batch)
    assert len(rejected) == 1
    origin, reason = rejected[0]
    assert origin is origin_2
    assert "(400)" in reason
    assert "mapper_parsing_exception" in reason
    assert "failed to parse field [age]" in reason
    assert h.metric("documents_total", action="index") == 1
    assert len(h.engine.bulks) == 1  # a 4xx is not retried


@pytest.mark.parametrize("status", [429, 500, 503])
def test_item_refused_for_now_is_sent_again_alone_after_a_sleep(
    make: MakeHarness, status: int
) -> None:
    h = make([{"2": status}, {}])
    batch = batch_of(change("insert", 1, 10), change("insert", 2, 11), change("insert", 3, 12))
    assert h.write(batch) == []
    assert h.engine.sent(0) == [("index", "1", 10), ("index", "2", 11), ("index", "3", 12)]
    assert h.engine.sent(1) == [("index", "2", 11)]
    assert h.engine.source("2", 1) == {"id": 2, "name": "n2@11"}
    assert h.log == ["bulk", "sleep 0.01", "bulk"]
    assert h.metric("retries_total") == 1
    assert h.metric("documents_total", action="index") == 3
    assert h.waits == []


def test_items_refused_repeatedly_back_off_exponentially_up_to_max(make: MakeHarness) -> None:
    h = make([{"1": 429}, {"1": 429}, {"1": 429}, {"1": 429}, {}])
    assert h.write(batch_of(change("insert", 1, 10))) == []
    assert h.sleeps == [0.01, 0.02, 0.04, 0.04]
    assert len(h.engine.bulks) == 5
    assert h.metric("retries_total") == 4


def test_item_retried_then_refused_for_good_is_rejected(make: MakeHarness) -> None:
    h = make([{"1": 429}, {"1": {"status": 400, "error": ERROR_400}}])
    rejected = h.write(batch_of(change("insert", 1, 10)))
    assert len(rejected) == 1
    assert "(400)" in rejected[0][1]
    assert h.sleeps == [0.01]


def test_failed_bulk_request_is_retried_with_the_writer_sleep(make: MakeHarness) -> None:
    h = make([ConnectionError("reset by peer"), {}])
    assert h.write(batch_of(change("insert", 1, 10))) == []
    assert h.log == ["bulk", "sleep 0.01", "bulk"]
    assert h.engine.sent(0) == h.engine.sent(1) == [("index", "1", 10)]
    assert h.metric("retries_total") == 1
    assert h.metric("documents_total", action="index") == 1
    assert h.waits == []


def test_permanent_bulk_failure_is_raised_without_retry(make: MakeHarness) -> None:
    h = make([ValueError("a bug")])
    with pytest.raises(ValueError, match="a bug"):
        h.write(batch_of(change("insert", 1, 10)))
    assert len(h.engine.bulks) == 1
    assert h.sleeps == []


def test_bulk_answer_with_the_wrong_item_count_is_retriable(make: MakeHarness) -> None:
    h = make()
    h.engine.bulk = lambda ndjson: [{"status": 201}]  # type: ignore[method-assign]
    batch = batch_of(change("insert", 1, 10), change("insert", 2, 11))
    with pytest.raises(RetriableError, match="1 items for 2 sent"):
        h.write(batch)
    assert h.metric("documents_total", action="index") == 0


# -- truncates --------------------------------------------------------------------------


def test_changes_at_or_before_the_truncate_are_dropped_below_the_floor(
    make: MakeHarness,
) -> None:
    """Dropped, and counted apart: the index does not hold these rows, so they are not
    stale (issue 37: stale only means not newer than the held row)."""
    h = make(truncated_lsn=20)
    batch = batch_of(change("insert", 1, 10), change("insert", 2, 20), change("insert", 3, 30))
    assert h.write(batch) == []
    assert h.engine.sent() == [("index", "3", 30)]
    assert h.metric("below_floor_events_total") == 2
    assert h.metric("stale_events_total") == 0
    assert h.metric("documents_total", action="index") == 1


def test_truncate_applies_per_index(make: MakeHarness) -> None:
    h = make()
    h.indexer.states[OTHER].truncated_lsn = 50
    batch = batch_of(change("insert", 1, 10))
    for doc_id, lsn in (("7", 40), ("8", 60)):
        ev = change("insert", int(doc_id), lsn)
        value = orjson.dumps(ev)
        batch.add(OTHER, decode(value), Origin("t", 0, lsn, None, value))
    h.write(batch)
    assert [(m["_index"], m["_id"]) for _, m, _ in h.engine.bulks[0]] == [
        (ALIAS, "1"),
        (OTHER, "8"),
    ]
    assert h.metric("below_floor_events_total") == 1


def test_batch_entirely_before_the_truncate_sends_nothing(make: MakeHarness) -> None:
    h = make(truncated_lsn=100)
    assert h.write(batch_of(change("insert", 1, 10), change("delete", 2, 99))) == []
    assert h.engine.bulks == []
    assert h.metric("below_floor_events_total") == 2
    assert h.metric("bulk_seconds_count") == 0


def test_stale_docs_do_not_trigger_toast_reads(make: MakeHarness) -> None:
    h = make(truncated_lsn=100)
    batch = batch_of(change("update", 1, 10, unchanged_toast=["bio"]))
    assert h.write(batch, before=(failed_future(),)) == []  # nothing left needs TOAST
    assert h.engine.mgets == []
    assert h.engine.bulks == []


# -- unchanged TOAST --------------------------------------------------------------------


def test_missing_toast_is_filled_from_the_stored_document(make: MakeHarness) -> None:
    stored = {ALIAS: {"1": {"id": 1, "name": "old", "bio": "stored bio", "extra": "x"}}}
    h = make(stored=stored)
    batch = batch_of(change("update", 1, 20, unchanged_toast=["bio"]), change("insert", 2, 21))
    assert h.write(batch) == []
    assert h.engine.mgets == [(ALIAS, ["1"])]  # only the document that needs it
    assert h.engine.source("1") == {"id": 1, "name": "n1@20", "bio": "stored bio"}
    assert batch.docs[(ALIAS, "1")].missing_toast == ()
    assert h.log == ["mget", "bulk"]


def test_missing_toast_of_an_unknown_document_is_left_out_not_nulled(make: MakeHarness) -> None:
    h = make(stored={})
    batch = batch_of(change("update", 1, 20, unchanged_toast=["bio"]))
    assert h.write(batch) == []
    source = h.engine.source("1")
    # recorded as unfilled, for an older row to fill (fill_unfilled)
    assert source == {"id": 1, "name": "n1@20", "_walcast_unfilled": ["bio"]}
    assert h.metric("unfilled_documents_total") == 1


def test_toast_known_to_the_batch_needs_no_read(make: MakeHarness) -> None:
    h = make(stored={ALIAS: {"1": {"bio": "stale stored"}}})
    batch = batch_of(
        change("insert", 1, 10, new={"id": 1, "name": "a", "bio": "fresh"}),
        change("update", 1, 20, unchanged_toast=["bio"]),
    )
    h.write(batch)
    assert h.engine.mgets == []
    assert h.engine.source("1") == {"id": 1, "name": "n1@20", "bio": "fresh"}


def test_toast_reads_are_one_mget_per_index(make: MakeHarness) -> None:
    stored = {ALIAS: {"1": {"bio": "b1"}, "2": {"bio": "b2"}}, OTHER: {"1": {"bio": "o1"}}}
    h = make(stored=stored)
    batch = batch_of(
        change("update", 1, 10, unchanged_toast=["bio"]),
        change("update", 2, 11, unchanged_toast=["bio"]),
    )
    ev = change("update", 1, 12, unchanged_toast=["bio"])
    value = orjson.dumps(ev)
    batch.add(OTHER, decode(value), Origin("t", 0, 1, None, value))
    h.write(batch)
    assert sorted(h.engine.mgets) == [(OTHER, ["1"]), (ALIAS, ["1", "2"])]
    sources = {(m["_index"], m["_id"]): s for _, m, s in h.engine.bulks[0]}
    assert sources[(ALIAS, "2")] == {"id": 2, "name": "n2@11", "bio": "b2"}
    assert sources[(OTHER, "1")] == {"id": 1, "name": "n1@12", "bio": "o1"}


def test_failed_toast_read_is_retried_with_the_writer_sleep(make: MakeHarness) -> None:
    h = make(stored={ALIAS: {"1": {"bio": "b"}}})
    h.engine.mget_failures.append(TimeoutError("read timed out"))
    h.write(batch_of(change("update", 1, 10, unchanged_toast=["bio"])))
    assert h.log == ["mget", "sleep 0.01", "mget", "bulk"]
    assert h.engine.source("1") == {"id": 1, "name": "n1@10", "bio": "b"}


def test_failed_earlier_write_blocks_a_batch_that_needs_toast(make: MakeHarness) -> None:
    h = make(stored={ALIAS: {"1": {"bio": "maybe outdated"}}})
    batch = batch_of(change("insert", 2, 9), change("update", 1, 10, unchanged_toast=["bio"]))
    with pytest.raises(RetriableError, match="earlier bulk write failed"):
        h.write(batch, before=(done_future(), failed_future()))
    assert h.engine.bulks == []
    assert h.engine.mgets == []
    assert h.metric("documents_total", action="index") == 0


def test_failed_earlier_write_does_not_block_a_batch_without_toast(make: MakeHarness) -> None:
    h = make()
    batch = batch_of(change("insert", 1, 10), change("delete", 2, 11))
    assert h.write(batch, before=(failed_future(),)) == []
    assert h.engine.sent() == [("index", "1", 10), ("delete", "2", 11)]


def test_successful_earlier_write_lets_toast_be_filled(make: MakeHarness) -> None:
    h = make(stored={ALIAS: {"1": {"bio": "b"}}})
    batch = batch_of(change("update", 1, 10, unchanged_toast=["bio"]))
    assert h.write(batch, before=(done_future(),)) == []
    assert h.engine.source("1") == {"id": 1, "name": "n1@10", "bio": "b"}


def test_toast_read_waits_for_an_earlier_write_still_running(make: MakeHarness) -> None:
    h = make(stored={ALIAS: {"1": {"bio": "b"}}})
    earlier: Future[list[Rejection]] = Future()
    seen: list[bool] = []
    mget = h.engine.mget

    def checked_mget(index: str, ids: list[str], fields: list[str] | None = None) -> Any:
        seen.append(earlier.done())
        return mget(index, ids, fields)

    h.engine.mget = checked_mget  # type: ignore[method-assign]
    timer = threading.Timer(0.05, earlier.set_result, args=([],))
    timer.start()
    try:
        h.write(batch_of(change("update", 1, 10, unchanged_toast=["bio"])), before=(earlier,))
    finally:
        timer.cancel()
    assert seen == [True]


# -- _settle ----------------------------------------------------------------------------


def make_doc(doc_id: str, *, delete: bool = False) -> Doc:
    origin = Origin("walcast.cdc", 0, int(doc_id), None, b"{}")
    return Doc(ALIAS, doc_id, delete, 1, None if delete else {"id": doc_id}, (), origin)


def test_settle_sorts_item_results(make: MakeHarness) -> None:
    h = make()
    docs = [make_doc(str(i), delete=i in (3, 7)) for i in range(9)]
    results: list[dict[str, Any]] = [
        {"status": 201},
        {"status": 200},
        {"status": 409},
        {"status": 404},  # a delete: already gone
        {"status": 429},
        {"status": 502},
        {"status": 400, "error": ERROR_400},
        {"status": 500},  # a delete: retried
        {},  # no status at all: refused for good
    ]
    rejected: list[Rejection] = []
    older: list[Doc] = []
    retry = h.indexer._settle(docs, results, rejected, older)
    assert [d.id for d in retry] == ["4", "5", "7"]
    assert [d.id for d in older] == ["2"]  # a row held newer: stale unless it fills
    assert [(o.offset, r.split(":")[0]) for o, r in rejected] == [
        (6, "refused by the engine (400)"),
        (8, "refused by the engine (0)"),
    ]
    assert h.metric("documents_total", action="index") == 2
    assert h.metric("documents_total", action="delete") == 1


def test_settle_appends_to_earlier_rejections(make: MakeHarness) -> None:
    h = make()
    earlier: Rejection = (Origin("t", 0, 99, None, b""), "earlier")
    rejected = [earlier]
    h.indexer._settle([make_doc("1")], [{"status": 400, "error": ERROR_400}], rejected, [])
    assert rejected[0] is earlier
    assert len(rejected) == 2


def test_settle_refuses_a_mismatched_answer(make: MakeHarness) -> None:
    h = make()
    with pytest.raises(RetriableError, match="0 items for 1 sent"):
        h.indexer._settle([make_doc("1")], [], [], [])


# -- rows that cannot be written as JSON (issue 36, finding 7) ------------------------------


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def deep_batch(depth: int) -> Batch:
    """An update leaving a TOASTed column unchanged (its row is decoded to merge it) whose
    jsonb value is nested ``depth`` deep, and an ordinary insert beside it."""
    import json

    b = Batch()
    deep = change("update", 1, 20, unchanged_toast=["bio"])
    deep["new"]["name"] = _nested(depth)
    for ev in (deep, change("insert", 2, 21)):
        value = json.dumps(ev).encode()  # orjson's encoder stops at 255 levels
        origin = Origin("walcast.cdc", 0, next(_offsets), None, value)
        assert b.add(ALIAS, decode(value), origin) is None
    return b


def test_a_merged_row_nested_deeper_than_orjson_writes_is_indexed_whole(
    make: MakeHarness,
) -> None:
    """A jsonb 300 levels deep in an update with an unchanged TOAST column: before the
    fix, the bulk body failed to serialize and the write (so the sink) failed for good."""
    h = make(stored={ALIAS: {"1": {"id": 1, "bio": "stored bio"}}})
    assert h.write(deep_batch(300)) == []
    assert h.engine.source("1") == {"id": 1, "name": _nested(300), "bio": "stored bio"}
    assert h.engine.source("2") == {"id": 2, "name": "n2@21"}


def test_a_merged_row_beyond_the_depth_limit_is_refused_and_the_rest_written(
    make: MakeHarness,
) -> None:
    h = make(stored={ALIAS: {"1": {"id": 1, "bio": "stored bio"}}})
    batch = deep_batch(600)
    rejected = h.write(batch)
    assert [(o.offset, r) for o, r in rejected] == [
        (
            batch.docs[(ALIAS, "1")].origin.offset,
            "the document cannot be written as JSON: a JSON value nested deeper than 512"
            " levels (walcast's limit)",
        )
    ]
    assert [a[1]["_id"] for a in h.engine.bulks[-1]] == ["2"]


# -- a full row is never refused in favour of a partial one (fill_unfilled) -------------


def test_an_older_full_row_fills_the_held_documents_unfilled_column(make: MakeHarness) -> None:
    # Held: key 1 at version 20, written from an update without its TOAST value `bio`.
    held = {"id": 1, "name": "n1@20", "_walcast_unfilled": ["bio"]}
    h = make(answers=[{"1": 409}], stored={ALIAS: {"1": held}})
    h.engine.versions[ALIAS] = {"1": 20}
    read_row = change("insert", 1, 5, new={"id": 1, "name": "old name", "bio": "the bio"})
    assert h.write(batch_of(read_row)) == []
    # the held document completed at the version it has; its own values kept
    assert h.engine.sent(1) == [("index", "1", 20)]
    assert h.engine.bulks[1][0][1]["version_type"] == "external_gte"
    assert h.engine.source("1", 1) == {"id": 1, "name": "n1@20", "bio": "the bio"}
    assert h.metric("filled_documents_total") == 1
    assert h.metric("stale_events_total") == 0


def test_an_older_row_for_a_complete_document_is_stale_and_writes_nothing(
    make: MakeHarness,
) -> None:
    h = make(answers=[{"1": 409}], stored={ALIAS: {"1": {"id": 1, "name": "x", "bio": "b"}}})
    assert h.write(batch_of(change("insert", 1, 5))) == []
    assert len(h.engine.bulks) == 1
    assert h.metric("stale_events_total") == 1
    assert h.metric("filled_documents_total") == 0


def test_an_older_row_lacking_the_column_too_fills_nothing(make: MakeHarness) -> None:
    held = {"id": 1, "name": "n", "_walcast_unfilled": ["bio"]}
    h = make(answers=[{"1": 409}], stored={ALIAS: {"1": held}})
    assert h.write(batch_of(change("update", 1, 5, unchanged_toast=["bio"]))) == []
    assert len(h.engine.bulks) == 1
    assert h.metric("stale_events_total") == 1


def test_a_refused_delete_or_fill_is_stale_without_a_read(make: MakeHarness) -> None:
    h = make(answers=[{"3": 409}])
    assert h.write(batch_of(change("delete", 3, 5))) == []
    assert h.engine.mgets == []
    assert h.metric("stale_events_total") == 1
    # a fill refused in turn (a newer write in between) is stale, not filled again
    held = {"id": 1, "name": "n", "_walcast_unfilled": ["bio"]}
    h = make(answers=[{"1": 409}, {"1": 409}], stored={ALIAS: {"1": held}})
    assert h.write(batch_of(change("insert", 1, 5, new={"id": 1, "bio": "b"}))) == []
    assert len(h.engine.bulks) == 2
    assert h.metric("stale_events_total") == 1


def test_an_older_full_row_later_in_the_batch_completes_the_newer_partial_one(
    make: MakeHarness,
) -> None:
    h = make(stored={})
    batch = batch_of(
        change("update", 1, 20, unchanged_toast=["bio"]),
        change("insert", 1, 5, new={"id": 1, "name": "read", "bio": "the bio"}),
    )
    assert h.write(batch) == []
    assert h.engine.mgets == [(ALIAS, ["1"])]  # the stored document first: it has none
    assert h.engine.sent() == [("index", "1", 20)]
    assert h.engine.source("1") == {"id": 1, "name": "n1@20", "bio": "the bio"}
    assert h.metric("unfilled_documents_total") == 0


def test_a_redelivered_row_from_before_the_stored_one_does_not_fill_the_update(
    make: MakeHarness,
) -> None:
    """Composition seed 39: the row as inserted before its table was dropped and created
    again (bio null), redelivered after the update that left bio unchanged, in the same
    batch. The stored document holds the value of the insert into the new table: that one
    is the update's, not the redelivered row's."""
    h = make(stored={ALIAS: {"1": {"id": 1, "name": "new table", "bio": "the bio"}}})
    batch = batch_of(
        change("update", 1, 30, unchanged_toast=["bio"]),
        change("insert", 1, 5, new={"id": 1, "name": "old table", "bio": None}),
    )
    assert h.write(batch) == []
    assert h.engine.source("1") == {"id": 1, "name": "n1@30", "bio": "the bio"}


def test_of_several_older_rows_the_newest_fills_what_the_store_lacks(
    make: MakeHarness,
) -> None:
    h = make(stored={})
    batch = batch_of(
        change("update", 1, 30, unchanged_toast=["bio"]),
        change("insert", 1, 5, new={"id": 1, "bio": "oldest"}),
        change("read", 1, 12, new={"id": 1, "bio": "newest older"}),
        change("insert", 1, 8, new={"id": 1, "bio": "older"}),
        change("update", 1, 40, unchanged_toast=["bio"]),  # unchanged since: the same
    )
    assert h.write(batch) == []
    assert h.engine.sent() == [("index", "1", 40)]
    assert h.engine.source("1") == {"id": 1, "name": "n1@40", "bio": "newest older"}


def test_snapshot_rows_wait_for_an_earlier_write_of_partial_rows(make: MakeHarness) -> None:
    """Overlapping writes: a batch with read rows handed over after one with rows that
    lack a TOAST value waits for it — written first, the read row would then be
    overwritten by the partial row, unfilled, and never fill it."""
    h = make(answers=[{}])
    events = [change("update", 1, 300, unchanged_toast=["bio"]),
              change("read", 1, 120, new={"id": 1, "bio": "b"})]  # fmt: skip
    batches = []
    for ev in events:  # as the loop does: a batch is filled, then the next one is made
        batches.append(b := h.indexer.new_batch())
        value = orjson.dumps(ev)
        assert h.indexer.add(b, decode(value), Origin("t", 0, 1, None, value)) is None
    first, second = batches
    pending: Future[list[Rejection]] = Future()
    done = threading.Event()

    def write_second() -> None:
        h.write(second, before=(pending,))
        done.set()

    threading.Thread(target=write_second, daemon=True).start()
    assert not done.wait(0.3), "the read rows were written before the partial rows"
    assert h.engine.bulks == []
    pending.set_result(h.write(first))  # the partial row, then the read row after it
    assert done.wait(10)
    assert [h.engine.sent(n) for n in range(len(h.engine.bulks))][:2] == [
        [("index", "1", 300)],
        [("index", "1", 120)],
    ]


def test_snapshot_rows_after_complete_rows_do_not_wait(make: MakeHarness) -> None:
    h = make()
    first, second = h.indexer.new_batch(), h.indexer.new_batch()
    for b, ev in ((first, change("update", 1, 300)), (second, change("read", 2, 120))):
        value = orjson.dumps(ev)
        assert h.indexer.add(b, decode(value), Origin("t", 0, 1, None, value)) is None
    never: Future[list[Rejection]] = Future()  # an earlier write still running
    assert h.write(second, before=(never,)) == []
    assert h.engine.sent() == [("index", "2", 120)]
