"""kafka2search: CDC topic(s) → OpenSearch / Elasticsearch, in a Kafka consumer group.

The loop, per consumer:

1. take records (``consume``) into a :class:`~services.kafka2search.documents.Batch`;
   poison records go to the dead-letter topic, heartbeats are skipped;
2. when the batch reaches ``batch.max_docs`` / ``max_bytes`` / ``max_wait_s`` — or a
   truncate / DDL event arrives, or partitions are revoked — *flush*: hand the batch to a
   writer thread, which fills unchanged TOAST columns from stored documents and sends one
   bulk request (retrying 429 / 5xx / connection failures with the configured backoff),
   while this thread goes on reading the next batch. Up to ``batch.concurrency`` writes
   run at once; the engine settles their overlaps by version (LSN), and a batch that
   needs stored TOAST values first waits for the writes before it;
3. when the oldest write is done: send what the engine refused to the dead-letter topic,
   wait for Kafka's acknowledgement, and only then commit the offsets of every record the
   write covered (checkpoint last). Writes are collected strictly in the order they were
   handed over, so a commit never covers a write that has not finished.

Index creation and new fields are handled on this thread as records arrive, so they exist
before the write carrying their data. A truncate or DDL event first waits for every
write before it, is applied, and only then is the data after it read, so the index
follows the table's history in order. Memory: ``batch.concurrency`` + 1 batch budgets
(those being written, the one being read) plus librdkafka's prefetch budget
(``consumer.max_queue_bytes``); while the engine refuses writes, the partitions are
paused and nothing more is taken.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.kafka2search.documents import Batch, Doc, Origin, bulk_body
from services.kafka2search.engines import SearchEngine, engine_for
from services.kafka2search.mapping import alias_name, index_name, properties
from services.kafka2search.settings import Kafka2SearchSettings
from shared.cli import stop_on_signals, tune_gc_for_records
from shared.contract.event import CONTROL_OPS, EventDecodeError, EventView, decode
from shared.errors import PermanentError, RetriableError, Verdict, http_status_verdict
from shared.http import OpsServer
from shared.kafka import KafkaOffsetCheckpointer, KafkaSink, Outgoing, ensure_topic
from shared.retry import call_with_retry

log = logging.getLogger(__name__)


class Metrics:
    def __init__(self, registry: CollectorRegistry, prefix: str = "walcast_kafka2search") -> None:
        self.docs = Counter(
            f"{prefix}_documents", "documents written, by action", ["action"], registry=registry
        )
        self.records = Counter(f"{prefix}_records", "Kafka records consumed", registry=registry)
        self.stale = Counter(
            f"{prefix}_stale_events",
            "changes older than the stored document (version conflict): skipped",
            registry=registry,
        )
        self.dlq = Counter(
            f"{prefix}_dead_letters", "records sent to the dead-letter topic", ["kind"],
            registry=registry,
        )  # fmt: skip
        self.retries = Counter(
            f"{prefix}_retries", "bulk requests or items retried", registry=registry
        )
        self.bulk_seconds = Histogram(
            f"{prefix}_bulk_seconds",
            "bulk request latency",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.lag = Gauge(
            f"{prefix}_lag_records", "high watermark minus position", ["topic", "partition"],
            registry=registry,
        )  # fmt: skip
        self.schema_changes = Counter(
            f"{prefix}_schema_changes", "truncates and DDL applied to indices", ["kind"],
            registry=registry,
        )  # fmt: skip


@dataclass
class IndexState:
    """What walcast knows of one table's index; mirrored in the index's ``_meta``."""

    alias: str
    index: str
    columns: dict[str, str]  # column -> Postgres type, as mapped
    truncated_lsn: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_meta(self) -> dict[str, Any]:
        return {
            "walcast": {
                **self.meta,
                "columns": self.columns,
                "truncated_lsn": self.truncated_lsn,
            }
        }


Rejection = tuple[Origin, str]  # a refused document's record and the engine's reason


@dataclass
class InFlight:
    """A batch handed to the writer thread and the offsets to commit once it is written."""

    future: Future[list[Rejection]]
    positions: dict[tuple[str, int], int]


_RENAME = re.compile(r"\bRENAME\b", re.IGNORECASE)
_MOVE_FIELD = "ctx._source[params.to] = ctx._source.remove(params.from)"
_DROP_FIELD = "ctx._source.remove(params.from)"


class Indexer:
    """The engine side: index states, schema changes, durable batch writes."""

    def __init__(
        self,
        settings: Kafka2SearchSettings,
        engine: SearchEngine,
        dlq: KafkaSink,
        metrics: Metrics,
        wait: Callable[[float], object],
    ) -> None:
        self.s = settings
        self.engine = engine
        self.dlq = dlq
        self.metrics = metrics
        self.wait = wait  # sleeps while keeping the consumer alive (partitions paused)
        self.states: dict[str, IndexState] = {}
        self.aliases: dict[tuple[str, str, str], str] = {}
        # alias -> the column types last seen mapped. Events share one object per distinct
        # types value (EventView.column_types), so a repeat is an identity check.
        self.prepared: dict[str, Mapping[str, str]] = {}
        # (db, schema, table, types, alias) of the last data event: see index_for.
        self.last: tuple[str, str, str, Mapping[str, str], str] | None = None

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
            and types is last[3]
            and ev.table == last[2]
            and ev.schema == last[1]
            and ev.db == last[0]
        ):
            return last[4]
        alias = self.alias_for(ev)
        if self.prepared.get(alias) is not types:
            self.state(alias, ev, types)
            self.prepared[alias] = types
        self.last = (ev.db, ev.schema, ev.table, types, alias)
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
        if index is None:
            meta = {"db": ev.db, "schema": ev.schema, "table": ev.table}
            st = IndexState(alias, index_name(alias), dict(types), 0, meta)
            if self.engine.create_index(
                st.index, alias, self.s.index, properties(types), st.to_meta()
            ):
                log.info("created index %s (alias %s)", st.index, alias)
                return st
            index = self.engine.resolve_alias(alias) or st.index
        _props, meta_doc = self.engine.mapping(index)
        w = meta_doc.get("walcast", {})
        meta = {k: v for k, v in w.items() if k not in ("columns", "truncated_lsn")}
        return IndexState(
            alias, index, dict(w.get("columns", {})), int(w.get("truncated_lsn", 0)), meta
        )

    def _add_columns(self, st: IndexState, new: Mapping[str, str]) -> None:
        columns = {**st.columns, **new}
        meta = IndexState(st.alias, st.index, columns, st.truncated_lsn, st.meta).to_meta()
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

    def _save_meta(self, st: IndexState) -> None:
        self.engine.put_mapping(st.index, {}, st.to_meta())

    # -- control events ----------------------------------------------------------------

    def truncate(self, ev: EventView) -> None:
        """All documents of the table go; changes older than the truncate stay out."""
        alias = self.alias_for(ev)
        st = self.state(alias, ev, {})
        if ev.lsn <= st.truncated_lsn:
            return  # a redelivered truncate
        deleted = self.retry(lambda: self.engine.delete_all(st.index), f"truncate {alias}")
        st.truncated_lsn = ev.lsn
        self.retry(lambda: self._save_meta(st), f"record the truncate of {alias}")
        self.metrics.schema_changes.labels("truncate").inc()
        log.info("truncated %s: %d documents removed", alias, deleted)

    def ddl(self, ev: EventView) -> None:
        d = ev.ddl
        alias = self.alias_for(ev)
        self.prepared.clear()  # the index's columns, or the index itself, change
        self.last = None
        if d.get("dropped"):
            self.metrics.schema_changes.labels("drop_table").inc()
            if self.s.index.on_drop_table == "delete":
                index = self.retry(lambda: self.engine.resolve_alias(alias), f"find {alias}")
                if index is not None:
                    self.retry(lambda: self.engine.delete_index(index), f"delete {index}")
                    log.info("table dropped: index %s deleted", index)
                self.states.pop(alias, None)
            else:
                log.info("table dropped: index %s retained (index.on_drop_table)", alias)
            return
        columns = d.get("columns")
        if not isinstance(columns, list):
            return  # DDL without a resulting schema (nothing to map)
        after = {str(c["name"]): str(c["type"]) for c in columns if isinstance(c, dict)}
        st = self.state(alias, ev, {})
        removed = [c for c in st.columns if c not in after]
        added = {c: t for c, t in after.items() if c not in st.columns}
        statement = str(d.get("statement", ""))
        renames: list[tuple[str, str]] = []
        if len(removed) == 1 and len(added) == 1 and _RENAME.search(statement):
            renames.append((removed[0], next(iter(added))))
            removed = []
        if added:
            self.retry(lambda: self._add_columns(st, added), f"map new columns of {alias}")
        for old, new in renames:
            moved = self.retry(
                partial(
                    self.engine.update_all, st.index, old, _MOVE_FIELD, {"from": old, "to": new}
                ),
                f"rename {old} in {alias}",
            )
            log.info("column %s renamed to %s in %s: %d documents moved", old, new, alias, moved)
            self.metrics.schema_changes.labels("rename_column").inc()
        for old in removed:
            cleared = self.retry(
                partial(self.engine.update_all, st.index, old, _DROP_FIELD, {"from": old}),
                f"drop {old} in {alias}",
            )
            log.info("column %s dropped from %s: %d documents cleared", old, alias, cleared)
            self.metrics.schema_changes.labels("drop_column").inc()
        if removed or renames:
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
        docs = [d for d in batch.docs.values() if d.lsn > self.states[d.index].truncated_lsn]
        self.metrics.stale.inc(len(batch.docs) - len(docs))
        if batch.toast:
            # Stored TOAST values must include what earlier writes carry; and if one
            # failed, its records are read again, so filling from an older document
            # would write a wrong value the re-read could not correct.
            if any(d.missing_toast for d in docs) and any(f.exception() for f in before):
                raise RetriableError("an earlier bulk write failed")
            self._fill_toast(docs, sleep)
        pending = docs
        rejected: list[Rejection] = []
        delays = self.s.retry.delays()
        while pending:
            started = time.monotonic()
            body = bulk_body(pending)
            results = self.retry(partial(self.engine.bulk, body), "bulk write", sleep)
            self.metrics.bulk_seconds.observe(time.monotonic() - started)
            pending = self._settle(pending, results, rejected)
            if pending:  # items refused with 429 / 5xx: again, after a backoff
                self.metrics.retries.inc(len(pending))
                log.warning("%d documents refused for now; retrying", len(pending))
                sleep(next(delays, self.s.retry.max_s))
        return rejected

    def _settle(
        self, docs: list[Doc], results: list[dict[str, Any]] | None, rejected: list[Rejection]
    ) -> list[Doc]:
        """Count what was written; collect what the engine refuses for good; return what
        to retry (429 / 5xx per item). ``results`` None: every action succeeded."""
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
            if 200 <= status < 300 or (doc.delete and status == 404):
                action = "delete" if doc.delete else "index"
                written[action] = written.get(action, 0) + 1
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

    def _fill_toast(self, docs: list[Doc], sleep: Callable[[float], object]) -> None:
        by_index: dict[str, list[Doc]] = {}
        for d in docs:
            if d.missing_toast:
                by_index.setdefault(d.index, []).append(d)
        for index, group in by_index.items():
            stored = self.retry(
                partial(self.engine.mget, index, [d.id for d in group]),
                "read stored documents for unchanged TOAST values",
                sleep,
            )
            for d in group:
                src = stored.get(d.id, {})
                row = d.row()
                for column in d.missing_toast:
                    if column in src:
                        row[column] = src[column]
                d.missing_toast = ()

    def dead_letter(self, origin: Origin, reason: str, kind: str) -> None:
        """The original bytes, the reason and the source position, to the DLQ topic."""
        headers = [
            ("walcast-error", reason.encode()[:4000]),
            ("walcast-error-kind", kind.encode()),
            ("walcast-source-topic", origin.topic.encode()),
            ("walcast-source-partition", str(origin.partition).encode()),
            ("walcast-source-offset", str(origin.offset).encode()),
        ]
        self.dlq.write(Outgoing(self.s.consumer.dlq_topic, origin.key, origin.value, headers), 0)
        self.metrics.dlq.labels(kind).inc()
        log.warning(
            "dead letter from %s[%d]@%d: %s", origin.topic, origin.partition, origin.offset, reason
        )


class SearchPipeline:
    """One consumer-group member: consume, batch, flush, commit (see the module doc)."""

    def __init__(
        self,
        settings: Kafka2SearchSettings,
        engine: SearchEngine,
        metrics: Metrics,
        stop_event: threading.Event,
        *,
        group_id: str | None = None,
        start: Callable[[Consumer, list[TopicPartition]], None] | None = None,
        until: dict[tuple[str, int], int] | None = None,
    ) -> None:
        self.s = settings
        self.engine = engine
        self.metrics = metrics
        self.stop_event = stop_event
        self.group_id = group_id or settings.consumer.group_id
        self.start = start  # replay: position the partitions instead of the group offsets
        self.until = until  # replay: stop once every partition reached this offset
        self.batch = Batch()
        self.positions: dict[tuple[str, int], int] = {}
        self.batch_started = 0.0
        self.flushing = False
        self.consumer: Consumer | None = None
        self.checkpointer: KafkaOffsetCheckpointer | None = None
        self.last_loop = time.monotonic()
        self.assigned: list[TopicPartition] = []
        self.held: list[Message] = []
        self.paused = False
        self.in_callback = False
        self.inflight: deque[InFlight] = deque()
        self.unconfirmed: dict[tuple[str, int], int] = {}  # committed without waiting
        self.writer: ThreadPoolExecutor | None = None
        self.next_lag = 0.0
        self.dlq = KafkaSink(
            {**settings.kafka.client_config(), "linger.ms": 5},
            max_inflight_bytes=16 * 1024 * 1024,
            while_waiting=self.tick,
        )
        self.indexer = Indexer(settings, engine, self.dlq, metrics, self.wait)

    def tick(self) -> None:
        self.last_loop = time.monotonic()

    def consumer_config(self) -> dict[str, Any]:
        c = self.s.consumer
        return {
            **self.s.kafka.client_config(),
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": c.auto_offset_reset,
            "queued.max.messages.kbytes": max(c.max_queue_bytes // 1024, 1024),
            "fetch.max.bytes": min(c.max_queue_bytes, 50 * 1024 * 1024),
            "session.timeout.ms": c.session_timeout_ms,
            "max.poll.interval.ms": c.max_poll_interval_ms,
            "partition.assignment.strategy": "cooperative-sticky",
        }

    # -- the loop ----------------------------------------------------------------------

    def run_once(self) -> None:
        ensure_topic(
            self.s.kafka.client_config(),
            self.s.consumer.dlq_topic,
            self.s.consumer.dlq_partitions,
            self.s.consumer.dlq_replication_factor,
        )
        # A reconnect starts clean: whatever the failed attempt held is read again (and a
        # position it had not written must never be committed by this one).
        self.batch = Batch()
        self.positions = {}
        self.held = []
        self.unconfirmed = {}
        self.paused = False
        self.checkpointer = KafkaOffsetCheckpointer()
        consumer = Consumer({**self.consumer_config(), "on_commit": self.checkpointer.on_commit})
        self.consumer = consumer
        self.checkpointer.consumer = consumer
        self.writer = ThreadPoolExecutor(
            self.s.batch.concurrency, thread_name_prefix="kafka2search-bulk"
        )
        try:
            if self.start is not None:
                parts = self._partitions(consumer)
                self.start(consumer, parts)
            else:
                consumer.subscribe(
                    list(self.s.consumer.topics),
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_lost,
                )
            b = self.s.batch
            while not self.stop_event.is_set():
                self.tick()
                if self.held:
                    records, self.held = self.held, []
                else:
                    timeout = 0.2
                    if self.batch.records:  # never past the batch's deadline
                        left = b.max_wait_s - (time.monotonic() - self.batch_started)
                        timeout = min(timeout, max(left, 0.0))
                    records = consumer.consume(min(b.max_docs, 10_000), timeout=timeout)
                if records:
                    self.metrics.records.inc(len(records))
                for msg in records:
                    self.handle(msg)
                if self.batch.records and (
                    len(self.batch) >= b.max_docs
                    or self.batch.bytes >= b.max_bytes
                    or time.monotonic() - self.batch_started >= b.max_wait_s
                ):
                    self.flush(drain=False)
                elif not self.batch.records and self.positions:
                    self.flush(drain=False)  # only skipped records: commit them
                elif self.inflight and self.inflight[0].future.done():
                    self.collect(block=False)  # commit as soon as writes are done
                self.update_lag()
                if self.until is not None and self._reached_end():
                    self.flush()
                    return
            self.flush()
        finally:
            self.consumer = None
            self._abandon()
            self.writer.shutdown(wait=True)
            try:
                consumer.close()
            finally:
                self.dlq.close()

    def handle(self, msg: Message) -> None:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            raise KafkaException(err)
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None
        assert partition is not None
        assert offset is not None
        value = msg.value()
        origin = Origin(topic, partition, offset, msg.key(), value or b"")
        try:
            ev = decode(value)
        except EventDecodeError as exc:
            self.indexer.dead_letter(origin, str(exc), "poison")
            self._mark(topic, partition, offset)
            return
        op = ev.op
        if op in CONTROL_OPS:
            self.flush()  # the data before it is written first
            if op == "truncate":
                self.indexer.truncate(ev)
            else:
                self.indexer.ddl(ev)
            self._mark(topic, partition, offset)
            self.flush()  # commit the control event itself
            return
        if not self.batch.records:
            self.batch_started = time.monotonic()
        alias = self.indexer.index_for(ev)
        reason = self.batch.add(alias, ev, origin)
        if reason is not None:
            self.indexer.dead_letter(origin, reason, "rejected")
        key = (topic, partition)  # _mark, inline: once per record
        if offset > self.positions.get(key, -1):
            self.positions[key] = offset

    def _mark(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        if offset > self.positions.get(key, -1):
            self.positions[key] = offset

    def flush(self, *, drain: bool = True) -> None:
        """Hand the batch to a writer and commit what finished writes covered. With
        ``drain`` (control events, revocation, stop) also wait for every write and commit
        it, so nothing is in flight when this returns."""
        if self.flushing:
            return
        self.flushing = True
        try:
            self.collect(block=False)
            self.resume()  # partitions paused by a backoff on this thread
            if self.batch.records:
                assert self.writer is not None
                while len(self.inflight) >= self.s.batch.concurrency:
                    self._collect_oldest()
                before = tuple(f.future for f in self.inflight)
                batch, self.batch = self.batch, Batch()
                future = self.writer.submit(self.indexer.write, batch, self._writer_sleep, before)
                self.inflight.append(InFlight(future, self.positions))
            elif self.positions:  # only skipped records (heartbeats, dead letters)
                done: Future[list[Rejection]] = Future()
                done.set_result([])
                self.inflight.append(InFlight(done, self.positions))  # committed in turn
            self.positions = {}
            if drain:
                self.collect(block=True)
                self._commit({}, wait=True)  # the partitions may change owner next
        finally:
            self.flushing = False

    def collect(self, *, block: bool) -> None:
        """Settle finished writes, oldest first (with ``block``: all of them, waiting)."""
        while self.inflight and (block or self.inflight[0].future.done()):
            self._collect_oldest(wait=block)
        self.resume()

    def _collect_oldest(self, *, wait: bool = False) -> None:
        """Wait for the oldest write; dead-letter what it refused; commit its offsets
        (without waiting for the broker's answer unless ``wait``: see
        KafkaOffsetCheckpointer). Its failure is raised here (the uncommitted records are
        read again after the reconnect)."""
        flight = self.inflight[0]
        self._await(flight.future)
        if not self.inflight or self.inflight[0] is not flight:
            return  # abandoned meanwhile (partitions lost): nothing of it is committed
        self.inflight.popleft()
        for origin, reason in flight.future.result():
            self.indexer.dead_letter(origin, reason, "rejected")
        self.dlq.flush(60)
        self._commit(flight.positions, wait)

    def _commit(self, positions: dict[tuple[str, int], int], wait: bool) -> None:
        """Commit ``positions``; with ``wait``, also what was committed without waiting
        before (sent again, in order after it: once this answer is in, so is theirs)."""
        if self.checkpointer is None or self.start is not None:
            return
        if wait:
            positions = {**self.unconfirmed, **positions}
            self.unconfirmed = {}
        elif positions:
            self.unconfirmed.update(positions)
        self.checkpointer.commit(positions, wait=wait)

    def _await(self, future: Future[list[Rejection]]) -> None:
        """Block until the write is done. A write that takes long (the engine is slow
        or down) pauses the partitions and keeps polling, so the member stays in the
        group and nothing more is fetched; inside a rebalance callback it just blocks."""
        done, _ = wait_for([future], timeout=1.0)
        if done or self.consumer is None or self.in_callback:
            future.exception()  # wait
            return
        if not self.paused:
            assignment = self.consumer.assignment()
            if assignment:
                self.consumer.pause(assignment)
            self.paused = True
        while not future.done():
            self.tick()
            msg = self.consumer.poll(0.2)
            if msg is not None:
                self.held.append(msg)

    def _abandon(self) -> None:
        """Leaving without committing: let the writes in flight end (their records are
        uncommitted, so they are read again; external versions make that harmless)."""
        flights, self.inflight = self.inflight, deque()
        for flight in flights:
            flight.future.exception()  # wait; a failure is moot now

    def _writer_sleep(self, seconds: float) -> None:
        if self.stop_event.wait(seconds):
            raise RetriableError("stopping while waiting to retry")

    def wait(self, seconds: float) -> None:
        """Back off without leaving the group: the partitions stay paused until the write
        that failed went through (``resume``), so nothing is fetched meanwhile; the
        consumer is polled to keep its membership (a record fetched before the pause is
        held for later, never dropped)."""
        consumer = self.consumer
        deadline = time.monotonic() + seconds
        if consumer is None:
            self.stop_event.wait(seconds)
            return
        if not self.paused:
            assignment = consumer.assignment()
            if assignment:
                consumer.pause(assignment)
            self.paused = True
        while time.monotonic() < deadline and not self.stop_event.is_set():
            self.tick()
            msg = consumer.poll(min(0.2, max(0.0, deadline - time.monotonic())))
            if msg is not None:
                self.held.append(msg)
        if self.stop_event.is_set():
            raise RetriableError("stopping while waiting to retry")

    def resume(self) -> None:
        if self.paused and self.consumer is not None:
            assignment = self.consumer.assignment()
            if assignment:
                self.consumer.resume(assignment)
        self.paused = False

    # -- group membership --------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.paused and partitions:
            consumer.pause(partitions)  # newly assigned during a backoff: paused as well
        self.assigned = list(consumer.assignment())
        log.info("assigned %s", _names(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Flush what is in hand before the partitions go to another member."""
        self.held = [m for m in self.held if not _in(m, partitions)]
        if self.flushing:
            # Served by the poll of a flush waiting for a write: that flush goes on with
            # the batch in hand and commits it once written. Dropping the batch here would
            # lose the records of the partitions this member keeps; those of the revoked
            # ones are written (harmless) and committed after them (never past a record
            # not written).
            log.info("revoked %s while flushing: the batch in hand is written", _names(partitions))
            return
        log.info("revoked %s: flushing", _names(partitions))
        self.in_callback = True
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - the new owner re-reads the uncommitted
            log.warning("flush on revoke failed: %s", exc)
            self._abandon()
        finally:
            self.in_callback = False
        self.batch.clear()
        self.positions = {}
        self.held = [m for m in self.held if not _in(m, partitions)]
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.unconfirmed = {k: o for k, o in self.unconfirmed.items() if k not in gone}

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning(
            "lost %s (session expired): uncommitted records will be re-read", _names(partitions)
        )
        self._abandon()
        self.batch.clear()
        self.positions = {}
        self.held = []
        self.unconfirmed = {}

    def _partitions(self, consumer: Consumer) -> list[TopicPartition]:
        parts: list[TopicPartition] = []
        for topic in self.s.consumer.topics:
            md = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if md is None or md.error is not None:
                raise PermanentError(
                    f"Kafka topic {topic!r} does not exist", hint="check consumer.topics"
                )
            parts.extend(TopicPartition(topic, p) for p in sorted(md.partitions))
        return parts

    def _reached_end(self) -> bool:
        assert self.until is not None
        assert self.consumer is not None
        if self.batch.records or self.held or self.inflight:
            return False
        for tp in self.consumer.position(list(self.consumer.assignment())):
            end = self.until.get((tp.topic, tp.partition), 0)
            if tp.offset < end:
                return False
        return True

    def update_lag(self) -> None:
        now = time.monotonic()
        consumer = self.consumer
        if now < self.next_lag or consumer is None:
            return
        self.next_lag = now + 10
        try:
            for tp in consumer.position(list(consumer.assignment())):
                # From the last fetch response: no broker round trip on the hot path.
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:
                    continue
                pos = tp.offset if tp.offset >= 0 else high
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(max(0, high - pos))
        except KafkaException as exc:
            log.debug("lag not updated: %s", exc)

    def run(self) -> None:
        """Run until stopped; transient failures reconnect with the configured backoff
        (what was not committed is read again)."""
        call_with_retry(
            self.run_once, policy=self.s.retry, what="consume and index", sleep=self.stop_event.wait
        )


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"


def _in(msg: Message, partitions: list[TopicPartition]) -> bool:
    return any(msg.topic() == tp.topic and msg.partition() == tp.partition for tp in partitions)


@dataclass
class Service:
    settings: Kafka2SearchSettings
    registry: CollectorRegistry
    pipeline: SearchPipeline
    ops: OpsServer | None
    stop_event: threading.Event

    def run(self) -> None:
        tune_gc_for_records()
        if self.ops is not None:
            self.ops.start()
        try:
            self.pipeline.run()
        finally:
            if self.ops is not None:
                self.ops.stop()
            self.pipeline.engine.close()

    def stop(self, *_: object) -> None:
        self.stop_event.set()

    def install_signal_handlers(self) -> None:
        stop_on_signals(self.stop, "after the batch in hand")


def build(settings: Kafka2SearchSettings) -> Service:
    """Wire the service: engine adapter, pipeline, metrics and the ops endpoint."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    stop_event = threading.Event()
    engine = engine_for(settings.engine)
    pipeline = SearchPipeline(settings, engine, metrics, stop_event)
    ops = None
    if settings.http.enabled:
        ops = OpsServer(registry, settings.http.host, settings.http.port)
        stall = max(120.0, settings.consumer.max_poll_interval_ms / 1000)
        ops.add_health_check(
            "loop",
            lambda: (
                time.monotonic() - pipeline.last_loop < stall,
                f"last loop {time.monotonic() - pipeline.last_loop:.1f}s ago",
            ),
        )
        ops.add_ready_check("engine", lambda: (engine.ping(), engine.name))
        ops.add_ready_check("assigned", lambda: (pipeline.consumer is not None, "consumer running"))
    return Service(settings, registry, pipeline, ops, stop_event)


__all__ = ["Indexer", "SearchPipeline", "Service", "build"]
