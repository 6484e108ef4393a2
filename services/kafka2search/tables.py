"""Table-wide events applied to a table's index, in the stream's order, with nothing in
flight (the consumer loop hands them over between batches): a truncate, a snapshot's
markers and a schema change. Each moves the index's floor or schema forward, never back
— under primary-key partitioning every partition carries a copy, and copies of older
events arrive after newer ones."""

from __future__ import annotations

import logging
from functools import partial

from services.kafka2search.engines import SearchEngine
from services.kafka2search.indices import EngineRetry, Indices, forget
from services.kafka2search.key_ranges import ranges_query
from services.kafka2search.mapping import has_key_fields, key_field
from services.kafka2search.metrics import Metrics
from services.kafka2search.settings import Kafka2SearchSettings
from shared.contract import keyranges
from shared.contract.ddl import column_numbers
from shared.contract.ddl import renames as ddl_renames
from shared.contract.event import EventView
from shared.contract.moves import record as record_moves

log = logging.getLogger(__name__)


class TableEvents:
    """Truncates, snapshot markers and schema changes, each applied once (idempotent:
    a redelivery or another partition's copy changes nothing) and recorded in the
    index's ``_meta`` before the offsets that carry it are committed."""

    def __init__(
        self, settings: Kafka2SearchSettings, engine: SearchEngine, metrics: Metrics,
        indices: Indices, retry: EngineRetry,
    ) -> None:  # fmt: skip
        self.s = settings
        self.engine = engine
        self.metrics = metrics
        self.indices = indices
        self.retry = retry

    def apply(self, event: EventView) -> None:
        """One table-wide event (``op`` truncate, snapshot, ddl or verify: a verification
        marker changes nothing — the loop commits past it once everything before it is
        written, which is what verify waits for)."""
        if event.op == "verify":
            return
        if event.op == "truncate":
            self.truncate(event)
        elif event.op == "snapshot":
            self.snapshot(event)
        else:
            self.ddl(event)

    def truncate(self, ev: EventView) -> None:
        """Every document older than the truncate goes, and changes older than it stay
        out. Newer documents stay: under primary-key partitioning the truncate reaches
        each partition (pg2kafka sends it to all), and rows written after it may have
        been indexed from another partition before this copy arrived."""
        alias = self.indices.alias_for(ev)
        st = self.indices.state(alias, ev, {})
        version = ev.version()
        if version <= st.truncated_lsn:
            return  # a redelivered truncate, or its copy from another partition
        deleted = self.retry(
            lambda: self.engine.delete_older(st.index, version), f"truncate {alias}"
        )
        st.truncated_lsn = version
        self.retry(lambda: self.indices.save_meta(st), f"record the truncate of {alias}")
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
        alias = self.indices.alias_for(ev)
        version = ev.version()
        if info["phase"] == "range_end":
            self.range_end(ev)
            return
        if info["phase"] != "end":
            self.metrics.schema_changes.labels("snapshot_start").inc()
            log.info("snapshot %s of %s started (version %d)", info["id"], alias, version)
            return
        st = self.indices.state(alias, ev, {})
        floor = version - 1
        if floor <= st.truncated_lsn:
            return  # applied before, or a truncate after the snapshot's start
        deleted = self.retry(
            lambda: self.engine.delete_older(st.index, version, reopen=True),
            f"remove the rows snapshot {info['id']} did not find in {alias}",
        )
        st.truncated_lsn = floor
        self.retry(lambda: self.indices.save_meta(st), f"record the snapshot of {alias}")
        self.metrics.schema_changes.labels("snapshot_end").inc()
        log.info(
            "snapshot %s of %s ended (version %d, %s rows delivered): %d documents of rows"
            " no longer in the table removed",
            info["id"], alias, version, info.get("rows"), deleted,
        )  # fmt: skip

    def range_end(self, ev: EventView) -> None:
        """The end of a snapshot of key ranges (shared/contract/keyranges.py; ``repair``):
        as a snapshot's end, but only for the documents whose key lies in its ranges —
        every row the source holds there was delivered at the marker's version or later,
        so an older document there is of a row the source no longer has. Nothing outside
        the ranges changes, and no floor is recorded: applied again (a redelivery, a copy
        from another partition) it finds nothing more to remove, since each key's own
        newer change or read row comes after its older ones on the key's partition."""
        info = ev.snapshot
        alias = self.indices.alias_for(ev)
        version = ev.version()
        ranges = keyranges.parse(info.get("key_ranges"))  # validated with the event
        st = self.indices.held_state(alias, ev)
        if st is None or version - 1 <= st.truncated_lsn:
            return  # no index yet (nothing to remove), or truncated after the run's start
        types = {c: st.columns.get(c, "") for c in ranges.columns}
        fields = [key_field(c, t) for c, t in types.items()]
        if any(f != c for f, c in zip(fields, ranges.columns, strict=True)):
            props, _meta = self.retry(lambda: self.engine.mapping(st.index), f"map {alias}")
            lacking = has_key_fields(props, types)
            if lacking:
                # an index made before its key's text was indexed: a range query on it
                # would match nothing, and the rows the run did not find would stay
                log.error(
                    "snapshot %s of key ranges of %s: the index has no field of key"
                    " column(s) %s to find rows in the ranges by (made by an earlier"
                    " version); nothing removed: reindex the table into a new index",
                    info["id"], alias, lacking,
                )  # fmt: skip
                return
        deleted = self.retry(
            lambda: self.engine.delete_older(
                st.index, version, reopen=True, within=ranges_query(ranges, fields)
            ),
            f"remove the rows snapshot {info['id']} did not find in its key ranges of {alias}",
        )
        self.metrics.schema_changes.labels("snapshot_range_end").inc()
        log.info(
            "snapshot %s of key ranges of %s ended (version %d, %d range(s), %s rows"
            " delivered): %d documents of rows no longer in the table removed",
            info["id"], alias, version, len(ranges.ranges), info.get("rows"), deleted,
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
        alias = self.indices.alias_for(ev)
        self.indices.forget_runs()  # the index's columns, or the index itself, change
        version = ev.version()
        held = self.indices.held_state(alias, ev)
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
                self.indices.states.pop(alias, None)
            else:
                log.info("table dropped: index %s retained (index.on_drop_table)", alias)
                if held is not None:  # later copies of this DROP are skipped, as above
                    held.meta["schema_at"] = version
                    self.retry(lambda: self.indices.save_meta(held), f"record the drop of {alias}")
            return
        columns = d.get("columns")
        if not isinstance(columns, list):
            return  # DDL without a resulting schema (nothing to map)
        after = {str(c["name"]): str(c["type"]) for c in columns if isinstance(c, dict)}
        numbers = column_numbers(columns)
        st = self.indices.state(alias, ev, {})
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
            self.retry(lambda: self.indices.add_columns(st, added, pending),
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
        self.retry(lambda: self.indices.save_meta(st), f"record the schema of {alias}")
        if added:
            self.metrics.schema_changes.labels("add_column").inc()
