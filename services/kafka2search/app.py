"""kafka2search: CDC topic(s) → OpenSearch / Elasticsearch, in a Kafka consumer group.

The consume / batch / write / commit loop is the shared one (:mod:`shared.consumer`:
offsets committed only after the bulk write that covers them, partitions paused while
the engine refuses writes, a flush on revocation, dead letters, lag). This module is the
sink it feeds, :class:`Indexer`:

* each data event is folded into a :class:`~services.kafka2search.documents.Batch`
  after its table's index exists and maps the event's columns (index creation and new
  fields happen on the loop's thread, before the write carrying their data);
* ``write`` (on a writer thread) fills unchanged TOAST columns from stored documents and
  sends one bulk request, retrying 429 / 5xx / connection failures with the configured
  backoff; up to ``batch.concurrency`` writes overlap and the engine settles them by
  version (LSN); a batch that needs stored TOAST values first waits for the writes before
  it;
* a truncate, DDL or snapshot marker event reaches ``control`` with nothing in flight,
  so the index follows the table's history in order. A snapshot's ``read`` rows are
  indexed like inserts (versioned, so one older than the stored document is stale —
  unless it fills columns that document lacks: :mod:`services.kafka2search.partial`).

(A little over 600 lines: the indexer's control events — truncate, snapshot markers,
DDL — sit with the write path whose floors they set; splitting them would put the floor
rule in two files.)
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Histogram

from services.kafka2search.documents import Batch, Doc, Pending, bulk_body, encode_sources
from services.kafka2search.engines import SearchEngine, Stored, engine_for
from services.kafka2search.mapping import APPEND_ONLY, alias_name, index_name, properties
from services.kafka2search.moves import Moves, translate
from services.kafka2search.moves import record as record_moves
from services.kafka2search.partial import Read, fill_from_stored, fills
from services.kafka2search.settings import Kafka2SearchSettings
from shared.avro import RegistryDecoder
from shared.cli import tune_gc_for_records
from shared.consumer import ConsumerLoop, ConsumerMetrics
from shared.contract.ddl import column_numbers
from shared.contract.ddl import renames as ddl_renames
from shared.contract.event import EventView
from shared.errors import PermanentError, RetriableError, Verdict, http_status_verdict
from shared.interfaces import BatchSink, Origin, Rejection, Wait
from shared.retry import call_with_retry
from shared.service import Runner

log = logging.getLogger(__name__)


PREFIX = "walcast_kafka2search"


class Metrics:
    """The indexer's metrics; the loop's own (records, dead letters, lag) are
    :class:`~shared.consumer.ConsumerMetrics` under the same prefix."""

    def __init__(self, registry: CollectorRegistry, prefix: str = PREFIX) -> None:
        self.docs = Counter(
            f"{prefix}_documents", "documents written, by action", ["action"], registry=registry
        )
        self.stale = Counter(
            f"{prefix}_stale_events",
            "changes not newer than the stored document of their row (version conflict): skipped",
            registry=registry,
        )
        self.unfilled = Counter(
            f"{prefix}_unfilled_documents",
            "documents written without unchanged TOAST values neither the batch nor the"
            " index had (recorded in the document, for an older row to fill)",
            registry=registry,
        )
        self.filled = Counter(
            f"{prefix}_filled_documents",
            "documents whose unfilled columns a row older than them filled",
            registry=registry,
        )
        # Kept apart from `stale`: a row the index does not hold is never counted stale.
        self.below_floor = Counter(
            f"{prefix}_below_floor_events",
            "changes at or below their table's floor (its last truncate, creation or"
            " snapshot end, after which the index removed what was older): skipped",
            registry=registry,
        )
        self.retries = Counter(
            f"{prefix}_retries", "bulk requests or items retried", registry=registry
        )
        self.bulk_seconds = Histogram(
            f"{prefix}_bulk_seconds",
            "bulk request latency",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.indices_lost = Counter(
            f"{prefix}_indices_lost",
            "indices found deleted outside walcast (the service stops with what to do)",
            registry=registry,
        )
        self.schema_changes = Counter(
            f"{prefix}_schema_changes", "truncates, DDL and snapshot markers applied to indices",
            ["kind"],
            registry=registry,
        )  # fmt: skip


@dataclass
class IndexState:
    """What walcast knows of one table's index; mirrored in the index's ``_meta``."""

    alias: str
    index: str
    columns: dict[str, str]  # column -> Postgres type, as mapped
    # Changes at or below this version stay out: the last truncate's version, or S - 1
    # after a snapshot's end marker at version S (its rows, version S, still land). A
    # version is the LSN in epoch 0 (its stored name predates epochs).
    truncated_lsn: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    # (meta["moves"], parsed): see moves()
    _moves: tuple[object, Moves] | None = field(default=None, repr=False, compare=False)

    def moves(self) -> Moves:
        """The renames and drops the index applied (``moves.Moves``), parsed once per
        change of ``meta["moves"]`` (checked by identity: ``record`` replaces the list)."""
        raw = self.meta.get("moves")
        cached = self._moves
        if cached is None or cached[0] is not raw:
            cached = self._moves = (raw, Moves.of(self.meta))
        return cached[1]

    def to_meta(self) -> dict[str, Any]:
        return {
            "walcast": {
                **self.meta,
                "columns": self.columns,
                "truncated_lsn": self.truncated_lsn,
            }
        }


REGISTRY = "walcast-kafka2search-registry"
"""One document per alias kafka2search created: a deleted index is then recognised (the
alias is registered but missing) instead of being created again, empty."""


def register(engine: SearchEngine, alias: str, index: str) -> None:
    engine.request(
        "PUT",
        f"/{REGISTRY}/_doc/{quote_id(alias)}",
        body={"alias": alias, "index": index, "created_at": time.time()},
        params={"refresh": "true"},
    )


def registered(engine: SearchEngine, alias: str) -> bool:
    try:
        engine.request("GET", f"/{REGISTRY}/_doc/{quote_id(alias)}")
    except Exception as exc:
        if getattr(exc, "status_code", None) == 404:
            return False
        raise
    return True


def forget(engine: SearchEngine, alias: str) -> bool:
    """Let ``alias`` be created again, empty (after its index was lost)."""
    try:
        engine.request("DELETE", f"/{REGISTRY}/_doc/{quote_id(alias)}", params={"refresh": "true"})
    except Exception as exc:
        if getattr(exc, "status_code", None) == 404:
            return False
        raise
    return True


def quote_id(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _index_gone(result: dict[str, Any]) -> bool:
    error = result.get("error")
    return isinstance(error, dict) and error.get("type") == "index_not_found_exception"


class _LastRun:
    """The table and column types of the previous data event, and its alias: a run of
    one table's events with the same columns (the common case) is recognised by
    comparing with it, without hashing anything (:meth:`Indexer.index_for`; slots: read
    once per record)."""

    __slots__ = ("alias", "db", "schema", "table", "types")

    def __init__(
        self, db: str, schema: str, table: str, types: Mapping[str, str], alias: str
    ) -> None:
        self.db, self.schema, self.table, self.types, self.alias = db, schema, table, types, alias


class Indexer(BatchSink[Batch]):
    """The engine side, a :class:`~shared.consumer.BatchSink`: index states, schema
    changes, durable batch writes (its contract: ordering, idempotency by external
    version = LSN, what a failure means)."""

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
        self.wait = wait  # sleeps while keeping the consumer alive (partitions paused)
        self.states: dict[str, IndexState] = {}
        self.aliases: dict[tuple[str, str, str], str] = {}
        # alias -> the column types last seen mapped. Events share one object per distinct
        # types value (EventView.column_types), so a repeat is an identity check.
        self.prepared: dict[str, Mapping[str, str]] = {}
        # (db, schema, table, types, alias) of the last data event: see index_for.
        self.last: _LastRun | None = None
        self.lock = threading.Lock()
        self.unwritten: list[Pending] = []  # batches handed over, their writes not finished

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
        alias = self.alias_for(event)
        st = self._held_state(alias, event)  # never creates it
        if st is not None and "moves" in st.meta:  # a column was renamed or dropped
            event = translate(event, st.moves(), st.columns)
        return batch.add(self.index_for(event), event, origin)

    def control(self, event: EventView) -> None:
        if event.op == "truncate":
            self.truncate(event)
        elif event.op == "snapshot":
            self.snapshot(event)
        else:
            self.ddl(event)

    def alias_for(self, ev: EventView) -> str:
        key = (ev.db, ev.schema, ev.table)
        alias = self.aliases.get(key)
        if alias is None:
            alias = alias_name(self.s.index.name_template, *key)
            self.aliases[key] = alias
        return alias

    def retry(
        self, fn: Callable[[], Any], what: str, sleep: Callable[[float], object] | None = None
    ) -> Any:
        return call_with_retry(
            fn,
            policy=self.s.retry,
            what=what,
            sleep=sleep or self.wait,
            on_retry=lambda *_: self.metrics.retries.inc(),
        )

    # -- index state -------------------------------------------------------------------

    def index_for(self, ev: EventView) -> str:
        """The alias a data event is written to, once its index exists and maps the
        event's columns (so a new column is mapped before the data that carries it).
        Runs once per record. A run of events of one table with the same columns, the
        common case, is recognised by comparing the names with the previous event's:
        looking them up would hash three new strings per record."""
        types = ev.column_types()
        last = self.last
        if (
            last is not None
            and types is last.types
            and ev.table == last.table
            and ev.schema == last.schema
            and ev.db == last.db
        ):
            return last.alias
        alias = self.alias_for(ev)
        if self.prepared.get(alias) is not types:
            self.state(alias, ev, types)
            self.prepared[alias] = types
        self.last = _LastRun(ev.db, ev.schema, ev.table, types, alias)
        return alias

    def state(self, alias: str, ev: EventView, types: Mapping[str, str]) -> IndexState:
        """The index of ``alias``, created on first sight, with every column of ``types``
        mapped (new columns are added before the data that carries them is written)."""
        st = self.states.get(alias)
        if st is None:
            st = self.retry(lambda: self._load_or_create(alias, ev, types), f"open index {alias}")
            self.states[alias] = st
        if types.keys() <= st.columns.keys():
            return st
        new = {c: t for c, t in types.items() if c not in st.columns}
        if new:
            self.retry(lambda: self._add_columns(st, new), f"map new columns of {alias}")
        return st

    def _load_or_create(self, alias: str, ev: EventView, types: Mapping[str, str]) -> IndexState:
        index = self.engine.resolve_alias(alias)
        if index is None and registered(self.engine, alias):
            self.lost(alias)  # created before, gone now: never start it over empty
        if index is None:
            meta = {"db": ev.db, "schema": ev.schema, "table": ev.table}
            st = IndexState(alias, index_name(alias), dict(types), 0, meta)
            if self.engine.create_index(
                st.index, alias, self.s.index, properties(types), st.to_meta()
            ):
                register(self.engine, alias, st.index)
                log.info("created index %s (alias %s)", st.index, alias)
                return st
            index = self.engine.resolve_alias(alias) or st.index
        _props, meta_doc = self.engine.mapping(index)
        w = meta_doc.get("walcast", {})
        meta = {k: v for k, v in w.items() if k not in ("columns", "truncated_lsn")}
        return IndexState(
            alias, index, dict(w.get("columns", {})), int(w.get("truncated_lsn", 0)), meta
        )

    def _add_columns(
        self, st: IndexState, new: Mapping[str, str], pending: frozenset[str] = frozenset()
    ) -> None:
        """Map ``new`` columns. The ``_meta`` written with them records every column but
        ``pending`` ones (a rename's targets): those are recorded once their values have
        moved, so a rename interrupted in between is recognised as one when its DDL event
        comes again (not as a drop, which would erase the values)."""
        columns = {**st.columns, **new}
        recorded = {c: t for c, t in columns.items() if c not in pending}
        meta = IndexState(st.alias, st.index, recorded, st.truncated_lsn, st.meta).to_meta()
        try:
            self.engine.put_mapping(st.index, properties(new), meta)
        except Exception as exc:
            if getattr(exc, "status_code", None) != 400:
                raise
            # A type change the engine cannot apply in place (e.g. text -> integer): the
            # old mapping stays; values it cannot hold are refused per document (DLQ).
            log.warning(
                "index %s keeps its mapping for %s (a reindex is needed to change it): %s",
                st.index,
                sorted(new),
                exc,
            )
            self.engine.put_mapping(st.index, {}, meta)
        st.columns = columns

    def _held_state(self, alias: str, ev: EventView) -> IndexState | None:
        """The state of ``alias``'s index if it exists (never creates one)."""
        st = self.states.get(alias)
        if st is None and self.retry(lambda: self.engine.resolve_alias(alias), f"find {alias}"):
            st = self.state(alias, ev, {})
        return st

    def _save_meta(self, st: IndexState) -> None:
        self.engine.put_mapping(st.index, {}, st.to_meta())

    # -- control events ----------------------------------------------------------------

    def truncate(self, ev: EventView) -> None:
        """Every document older than the truncate goes, and changes older than it stay
        out. Newer documents stay: under primary-key partitioning the truncate reaches
        each partition (pg2kafka sends it to all), and rows written after it may have
        been indexed from another partition before this copy arrived."""
        alias = self.alias_for(ev)
        st = self.state(alias, ev, {})
        version = ev.version()
        if version <= st.truncated_lsn:
            return  # a redelivered truncate, or its copy from another partition
        deleted = self.retry(
            lambda: self.engine.delete_older(st.index, version), f"truncate {alias}"
        )
        st.truncated_lsn = version
        self.retry(lambda: self._save_meta(st), f"record the truncate of {alias}")
        self.metrics.schema_changes.labels("truncate").inc()
        log.info("truncated %s: %d documents removed", alias, deleted)

    def snapshot(self, ev: EventView) -> None:
        """A snapshot marker (docs/events.md, "Snapshots"). The start changes nothing. The
        end, at version S (its LSN, after the epoch), says every row the table now has
        was delivered with a version >= S: a document older than S is of a row that no
        longer exists, and goes, as in a truncate at S — but the floor kept is S - 1 and
        the deletes are versioned S - 1, so the snapshot's own rows (version S) still land
        after it (from another partition, under primary-key partitioning). A redelivered
        end marker, or its copy from another partition, does nothing."""
        info = ev.snapshot
        alias = self.alias_for(ev)
        version = ev.version()
        if info["phase"] != "end":
            self.metrics.schema_changes.labels("snapshot_start").inc()
            log.info("snapshot %s of %s started (version %d)", info["id"], alias, version)
            return
        st = self.state(alias, ev, {})
        floor = version - 1
        if floor <= st.truncated_lsn:
            return  # applied before, or a truncate after the snapshot's start
        deleted = self.retry(
            lambda: self.engine.delete_older(st.index, version, reopen=True),
            f"remove the rows snapshot {info['id']} did not find in {alias}",
        )
        st.truncated_lsn = floor
        self.retry(lambda: self._save_meta(st), f"record the snapshot of {alias}")
        self.metrics.schema_changes.labels("snapshot_end").inc()
        log.info(
            "snapshot %s of %s ended (version %d, %s rows delivered): %d documents of rows"
            " no longer in the table removed",
            info["id"], alias, version, info.get("rows"), deleted,
        )  # fmt: skip

    def ddl(self, ev: EventView) -> None:
        """A schema change, applied once and never behind one applied already: under
        primary-key partitioning every partition carries a copy, and a consumer reading
        several partitions meets the copies of older schema changes after newer ones. The
        event's ``columns`` are the table's whole schema after it, so the newest change
        applied covers the older ones; applying an older copy after it would revert the
        schema — clearing the values of the columns it lacks, renaming columns back (seen:
        a composition run under primary-key partitioning lost a renamed column's values
        that way). The version of the last change applied is kept in the index's
        ``_meta`` (``schema_at``), recorded with the schema it produced."""
        d = ev.ddl
        alias = self.alias_for(ev)
        self.prepared.clear()  # the index's columns, or the index itself, change
        self.last = None
        version = ev.version()
        held = self._held_state(alias, ev)
        if held is not None and version <= int(held.meta.get("schema_at", 0)):
            log.info(
                "schema change at version %d of %s skipped: %s is at version %s already (a"
                " copy from another partition, or a redelivery)",
                version, alias, alias, held.meta.get("schema_at"),
            )  # fmt: skip
            return
        if d.get("dropped"):
            self.metrics.schema_changes.labels("drop_table").inc()
            if self.s.index.on_drop_table == "delete":
                index = self.retry(lambda: self.engine.resolve_alias(alias), f"find {alias}")
                if index is not None:
                    self.retry(lambda: self.engine.delete_index(index), f"delete {index}")
                    # walcast deleted it: not lost, and a table created again starts over
                    self.retry(lambda: forget(self.engine, alias), f"forget {alias}")
                    log.info("table dropped: index %s deleted", index)
                self.states.pop(alias, None)
            else:
                log.info("table dropped: index %s retained (index.on_drop_table)", alias)
                if held is not None:  # later copies of this DROP are skipped, as above
                    held.meta["schema_at"] = version
                    self.retry(lambda: self._save_meta(held), f"record the drop of {alias}")
            return
        columns = d.get("columns")
        if not isinstance(columns, list):
            return  # DDL without a resulting schema (nothing to map)
        after = {str(c["name"]): str(c["type"]) for c in columns if isinstance(c, dict)}
        numbers = column_numbers(columns)
        st = self.state(alias, ev, {})
        recreated = str(d.get("tag", "")).upper() == "CREATE TABLE" and version > st.truncated_lsn
        if recreated:
            # Created (again): the documents of a table dropped under this name go.
            gone = self.retry(lambda: self.engine.delete_older(st.index, version), f"clear {alias}")
            st.truncated_lsn = version
            # the old table's column numbers and moves say nothing of the new one's
            st.meta.pop("numbers", None)
            st.meta.pop("moves", None)
            if gone:
                log.info("table %s created again: %d documents of the old one removed", alias, gone)
        removed = [c for c in st.columns if c not in after]
        added = {c: t for c, t in after.items() if c not in st.columns}
        # Renames by column number, never guessed from the text (shared.contract.ddl).
        known: dict[str, int] = dict(st.meta.get("numbers") or {})
        renames = ddl_renames(removed, added, known, numbers, str(d.get("statement") or ""))
        for old, _new in renames:
            removed.remove(old)
        if added:
            pending = frozenset(new for _old, new in renames)
            self.retry(lambda: self._add_columns(st, added, pending),
                       f"map new columns of {alias}")  # fmt: skip
        if numbers:  # recorded with the schema below, once the values moved
            st.meta["numbers"] = numbers
        for old, new in renames:
            moved = self.retry(
                partial(self.engine.rewrite_field, st.index, old, new),
                f"rename {old} in {alias}",
            )
            log.info("column %s renamed to %s in %s: %d documents moved", old, new, alias, moved)
            self.metrics.schema_changes.labels("rename_column").inc()
        for old in removed:
            cleared = self.retry(
                partial(self.engine.rewrite_field, st.index, old, None),
                f"drop {old} in {alias}",
            )
            log.info("column %s dropped from %s: %d documents cleared", old, alias, cleared)
            self.metrics.schema_changes.labels("drop_column").inc()
        if not recreated:  # for rows older than this DDL (a new table's rows never are)
            record_moves(st.meta, renames, removed, version)
        st.meta["schema_at"] = version
        st.columns = {c: t for c, t in st.columns.items() if c in after}
        self.retry(lambda: self._save_meta(st), f"record the schema of {alias}")
        if added:
            self.metrics.schema_changes.labels("add_column").inc()

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
        docs = [d for d in batch.docs.values() if d.lsn > self.states[d.index].truncated_lsn]
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
                self.lost(doc.index)
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

    def lost(self, alias: str) -> None:
        """The index behind ``alias`` was deleted outside walcast: the documents written
        so far are gone, and writing on would leave a silently partial copy. Stop with
        what to do (the registry keeps a restart from starting the table over empty)."""
        self.metrics.indices_lost.inc()
        self.states.pop(alias, None)
        self.prepared.pop(alias, None)
        self.last = None
        raise PermanentError(
            f"the index behind alias {alias!r} was deleted outside walcast: its documents are gone",
            hint=f"bring the table back whole: `kafka2search forget --alias {alias}`, then"
            " `kafka2search replay --from-offset 0 --allow-deleted-to-return` (or"
            " re-snapshot the table), then start the service",
        )

    def _reader(self, sleep: Callable[[float], object]) -> Read:
        def read(index: str, ids: list[str], fields: list[str] | None) -> dict[str, Stored]:
            stored: dict[str, Stored] = self.retry(
                partial(self.engine.mget, index, ids, fields),
                f"read stored documents of {index}",
                sleep,
            )
            return stored

        return read


@dataclass
class Service:
    settings: Kafka2SearchSettings
    runner: Runner
    loop: ConsumerLoop[Batch]
    indexer: Indexer
    engine: SearchEngine

    @property
    def registry(self) -> CollectorRegistry:
        return self.runner.registry

    def run(self) -> None:
        tune_gc_for_records()
        self.runner.run(self.loop.run, cleanup=self.engine.close)

    def stop(self, *_: object) -> None:
        self.runner.stop()

    def install_signal_handlers(self) -> None:
        self.runner.install_signal_handlers("after the batch in hand")


def consumer_loop(
    settings: Kafka2SearchSettings,
    engine: SearchEngine,
    registry: CollectorRegistry,
    stop_event: threading.Event,
    *,
    group_id: str | None = None,
    start: Callable[[Consumer, list[TopicPartition]], None] | None = None,
    until: dict[tuple[str, int], int] | None = None,
) -> tuple[ConsumerLoop[Batch], Indexer]:
    """The shared consumer loop feeding an :class:`Indexer` (``run``, and ``replay`` with
    ``start`` / ``until``)."""
    metrics = Metrics(registry)
    made: list[Indexer] = []

    def make_sink(wait: Wait) -> Indexer:
        made.append(Indexer(settings, engine, metrics, wait))
        return made[0]

    loop = ConsumerLoop[Batch](
        name="consume and index",
        kafka=settings.kafka,
        consumer=settings.consumer,
        batch=settings.batch,
        retry=settings.retry,
        metrics=ConsumerMetrics(registry, PREFIX),
        make_sink=make_sink,
        stop_event=stop_event,
        group_id=group_id,
        start=start,
        until=until,
        avro=(
            RegistryDecoder(settings.schema_registry.client())
            if settings.schema_registry.url is not None
            else None
        ),
    )
    return loop, made[0]


def build(settings: Kafka2SearchSettings) -> Service:
    """Wire the service: engine adapter, the consumer loop and its indexer, metrics and
    the ops endpoint."""
    runner = Runner(settings.http)
    engine = engine_for(settings.engine)
    loop, indexer = consumer_loop(settings, engine, runner.registry, runner.stop_event)
    stall = max(120.0, settings.consumer.max_poll_interval_ms / 1000)
    runner.health(
        "loop",
        lambda: (
            time.monotonic() - loop.last_loop < stall,
            f"last loop {time.monotonic() - loop.last_loop:.1f}s ago",
        ),
    )
    runner.ready("engine", lambda: (engine.ping(), engine.name))
    # Ready = consuming: the member joined the group and got its assignment (a restart
    # after kill -9 waits up to consumer.session_timeout_ms for the old member's share).
    runner.ready(
        "consuming",
        lambda: (
            loop.consumer is not None and loop.joined,
            f"{len(loop.assigned)} partitions assigned" if loop.joined else "joining the group",
        ),
    )
    return Service(settings, runner, loop, indexer, engine)


__all__ = ["Indexer", "Service", "build", "consumer_loop"]
