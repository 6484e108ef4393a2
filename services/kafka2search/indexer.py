"""The engine side of the consumer loop, a :class:`~shared.interfaces.BatchSink`: data
events folded into bulk batches, written by version (LSN), with unchanged TOAST values
filled and partial rows completed (:mod:`services.kafka2search.partial`).

* each data event is folded into a :class:`~services.kafka2search.documents.Batch`
  after its table's index exists and maps the event's columns (:mod:`.indices`: index
  creation and new fields happen on the loop's thread, before the write carrying their
  data); a row older than a rename or drop the index applied gets it first
  (:mod:`shared.contract.moves`);
* ``write`` (on a writer thread) fills unchanged TOAST columns from stored documents and
  sends one bulk request, retrying 429 / 5xx / connection failures with the configured
  backoff; up to ``batch.concurrency`` writes overlap and the engine settles them by
  version (LSN); a batch that needs stored TOAST values first waits for the writes before
  it;
* a truncate, DDL or snapshot marker event reaches ``control`` with nothing in flight
  (:mod:`.tables`), so the index follows the table's history in order. A snapshot's
  ``read`` rows are indexed like inserts (versioned, so one older than the stored
  document is stale — unless it fills columns that document lacks).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from functools import partial
from typing import Any

from services.kafka2search.documents import Batch, Doc, Pending, bulk_body, encode_sources
from services.kafka2search.engines import SearchEngine, Stored
from services.kafka2search.indices import EngineRetry, IndexState, Indices
from services.kafka2search.mapping import APPEND_ONLY
from services.kafka2search.metrics import Metrics
from services.kafka2search.partial import Read, fill_from_stored, fills
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.tables import TableEvents
from shared.contract.event import EventView
from shared.contract.moves import translate
from shared.errors import RetriableError, Verdict, http_status_verdict
from shared.interfaces import BatchSink, Origin, Rejection, Wait

log = logging.getLogger(__name__)


def _index_gone(result: dict[str, Any]) -> bool:
    error = result.get("error")
    return isinstance(error, dict) and error.get("type") == "index_not_found_exception"


class Indexer(BatchSink[Batch]):
    """The engine side, a :class:`~shared.consumer.BatchSink` (its contract: ordering,
    idempotency by external version = LSN, what a failure means): the index of each
    table (:class:`~services.kafka2search.indices.Indices`), table-wide events
    (:class:`~services.kafka2search.tables.TableEvents`) and durable batch writes."""

    def __init__(
        self,
        settings: Kafka2SearchSettings,
        engine: SearchEngine,
        metrics: Metrics,
        wait: Wait,
    ) -> None:
        self.s = settings
        self.engine = engine
        self.metrics = metrics
        # engine calls retried; on the loop's thread they back off with ``wait``, which
        # keeps the consumer alive (partitions paused); writer threads pass their own sleep
        self.retry = EngineRetry(settings.retry, wait, metrics.retries)
        self.indices = Indices(settings, engine, metrics, self.retry)
        self.tables = TableEvents(settings, engine, metrics, self.indices, self.retry)
        self.lock = threading.Lock()
        self.unwritten: list[Pending] = []  # batches handed over, their writes not finished

    @property
    def states(self) -> dict[str, IndexState]:
        return self.indices.states

    def alias_for(self, ev: EventView) -> str:
        return self.indices.alias_for(ev)

    def index_for(self, ev: EventView) -> str:
        return self.indices.index_for(ev)

    def truncate(self, ev: EventView) -> None:
        self.tables.truncate(ev)

    def snapshot(self, ev: EventView) -> None:
        self.tables.snapshot(ev)

    def ddl(self, ev: EventView) -> None:
        self.tables.ddl(ev)

    # -- the BatchSink side ------------------------------------------------------------

    def new_batch(self) -> Batch:
        """A batch that knows the writes handed over before it and not yet finished
        (called on the loop's thread, when the batch before it is handed over)."""
        batch = Batch()
        with self.lock:
            # every batch before this one is final (handed over, or dropped with a session)
            self.unwritten = [p for p in self.unwritten if p.partial and not p.written.is_set()]
            batch.earlier = list(self.unwritten)
            self.unwritten.append(batch.mark)
        return batch

    def add(self, batch: Batch, event: EventView, origin: Origin) -> str | None:
        alias = self.indices.alias_for(event)
        st = self.indices.held_state(alias, event)  # never creates it
        if st is not None and "moves" in st.meta:  # a column was renamed or dropped
            event = translate(event, st.moves(), st.columns)
        return batch.add(self.indices.index_for(event), event, origin)

    def control(self, event: EventView) -> None:
        self.tables.apply(event)

    # -- data --------------------------------------------------------------------------

    def write(
        self,
        batch: Batch,
        sleep: Callable[[float], object],
        before: tuple[Future[list[Rejection]], ...] = (),
    ) -> list[Rejection]:
        """Write ``batch`` (on a writer thread; ``sleep`` is its backoff wait; ``before``
        the writes handed over before this one, possibly still running). When this
        returns, every document is in the engine, stale, or returned as refused for good
        (the caller dead-letters those before committing); raises otherwise."""
        try:
            return self._write(batch, sleep, before)
        finally:
            batch.mark.written.set()

    def _write(
        self,
        batch: Batch,
        sleep: Callable[[float], object],
        before: tuple[Future[list[Rejection]], ...],
    ) -> list[Rejection]:
        if batch.reads and any(p.partial and not p.written.is_set() for p in batch.earlier):
            # Snapshot rows may fill what an earlier batch's rows lack: they go after it
            # (written first, they would be overwritten by the partial rows unfilled).
            wait_futures(before)
        docs = [
            d for d in batch.docs.values() if d.lsn > self.indices.states[d.index].truncated_lsn
        ]
        self.metrics.below_floor.inc(len(batch.docs) - len(docs))
        if batch.toast:
            # Stored TOAST values must include what earlier writes carry; and if one
            # failed, its records are read again, so filling from an older document
            # would write a wrong value the re-read could not correct.
            if any(d.missing_toast for d in docs) and any(f.exception() for f in before):
                raise RetriableError("an earlier bulk write failed")
            self.metrics.unfilled.inc(fill_from_stored(docs, self._reader(sleep)))
        # A merged row that cannot be written as JSON is dead-lettered, not a failed write.
        pending, rejected = encode_sources(docs)
        older = self._bulk(pending, rejected, sleep)
        if older:
            # Refused as older than the held document; unless it fills what that lacks.
            filling = fills(older, self._reader(sleep))
            self.metrics.stale.inc(len(older) - len(filling))
            self.metrics.filled.inc(len(filling))
            filling, refused = encode_sources(filling)
            rejected += refused
            # a fill refused in turn (stale): a newer write came in between, and is the row
            self._bulk(filling, rejected, sleep)
        return rejected

    def _bulk(
        self, pending: list[Doc], rejected: list[Rejection], sleep: Callable[[float], object]
    ) -> list[Doc]:
        """Write ``pending`` until each is written or refused for good (into ``rejected``);
        returns the rows refused as older than the document held (409)."""
        older: list[Doc] = []
        delays = self.s.retry.delays()
        while pending:
            started = time.monotonic()
            body = bulk_body(pending)
            results = self.retry(partial(self.engine.bulk, body), "bulk write", sleep)
            self.metrics.bulk_seconds.observe(time.monotonic() - started)
            pending = self._settle(pending, results, rejected, older)
            if pending:  # items refused with 429 / 5xx: again, after a backoff
                self.metrics.retries.inc(len(pending))
                log.warning("%d documents refused for now; retrying", len(pending))
                sleep(next(delays, self.s.retry.max_s))
        return older

    def _settle(
        self,
        docs: list[Doc],
        results: list[dict[str, Any]] | None,
        rejected: list[Rejection],
        older: list[Doc],
    ) -> list[Doc]:
        """Count what was written; collect what the engine refuses for good, and the
        rows it holds at a newer version (``older``: rows, not deletes); return what to
        retry (429 / 5xx per item). ``results`` None: every action succeeded."""
        if results is None:
            deletes = sum(1 for d in docs if d.delete)
            if deletes:
                self.metrics.docs.labels("delete").inc(deletes)
            if len(docs) > deletes:
                self.metrics.docs.labels("index").inc(len(docs) - deletes)
            return []
        if len(results) != len(docs):
            raise RetriableError(f"bulk answered {len(results)} items for {len(docs)} sent")
        retry: list[Doc] = []
        written: dict[str, int] = {}
        for doc, res in zip(docs, results, strict=True):
            status = int(res.get("status", 0))
            if status == 404 and _index_gone(res):
                self.indices.lost(doc.index)
            if 200 <= status < 300 or (doc.delete and status == 404):
                action = "delete" if doc.delete else "index"
                written[action] = written.get(action, 0) + 1
            elif status == 409 and not (doc.delete or doc.fill or doc.id.startswith(APPEND_ONLY)):
                older.append(doc)  # an insert-only table's row is never partial
            elif status == 409:
                self.metrics.stale.inc()
            elif http_status_verdict(status) is Verdict.RETRIABLE:
                retry.append(doc)
            else:
                reason = f"refused by the engine ({status}): {res.get('error')}"
                rejected.append((doc.origin, reason))
        for action, n in written.items():
            self.metrics.docs.labels(action).inc(n)
        return retry

    def _reader(self, sleep: Callable[[float], object]) -> Read:
        def read(index: str, ids: list[str], fields: list[str] | None) -> dict[str, Stored]:
            stored: dict[str, Stored] = self.retry(
                partial(self.engine.mget, index, ids, fields),
                f"read stored documents of {index}",
                sleep,
            )
            return stored

        return read
