"""The indices kafka2search keeps, one per table behind an alias: what it knows of each
(:class:`IndexState`, mirrored in the index's ``_meta``), the registry that recognises a
deleted index, and :class:`Indices` — finding, creating and mapping them, on the
consumer loop's thread, before the data that needs them is written."""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from services.kafka2search.engines import SearchEngine
from services.kafka2search.mapping import VERIFY_FIELDS, alias_name, index_name, properties
from services.kafka2search.metrics import Metrics
from services.kafka2search.settings import Kafka2SearchSettings
from shared.contract.event import EventView
from shared.contract.moves import Moves
from shared.errors import PermanentError
from shared.interfaces import Wait
from shared.retry import BackoffPolicy, call_with_retry

log = logging.getLogger(__name__)


class EngineRetry:
    """An engine call under the configured backoff (``retry``): transient failures are
    retried, a permanent one raises. ``sleep`` defaults to the loop's wait, which keeps
    the consumer alive (partitions paused); a writer thread passes its own."""

    def __init__(self, policy: BackoffPolicy, wait: Wait, retries: Counter) -> None:
        self.policy = policy
        self.wait = wait
        self.retries = retries

    def __call__(
        self, fn: Callable[[], Any], what: str, sleep: Callable[[float], object] | None = None
    ) -> Any:
        return call_with_retry(
            fn,
            policy=self.policy,
            what=what,
            sleep=sleep or self.wait,
            on_retry=lambda *_: self.retries.inc(),
        )


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


class _LastRun:
    """The table and column types of the previous data event, and its alias: a run of
    one table's events with the same columns (the common case) is recognised by
    comparing with it, without hashing anything (:meth:`Indices.index_for`; slots: read
    once per record)."""

    __slots__ = ("alias", "db", "schema", "table", "types")

    def __init__(
        self, db: str, schema: str, table: str, types: Mapping[str, str], alias: str
    ) -> None:
        self.db, self.schema, self.table, self.types, self.alias = db, schema, table, types, alias


class Indices:
    """The index of each table, by alias: found or created on first sight, new columns
    mapped before the data that carries them. Called on the consumer loop's thread, but
    for :meth:`lost`, which a writer thread calls when the engine says the index is gone
    (the service then stops); ``states`` is read by the writer threads (a state is never
    replaced while a write that uses it runs: control events come with nothing in
    flight)."""

    def __init__(
        self, settings: Kafka2SearchSettings, engine: SearchEngine, metrics: Metrics,
        retry: EngineRetry,
    ) -> None:  # fmt: skip
        self.s = settings
        self.engine = engine
        self.metrics = metrics
        self.retry = retry
        self.states: dict[str, IndexState] = {}
        self.aliases: dict[tuple[str, str, str], str] = {}
        # alias -> the column types last seen mapped. Events share one object per distinct
        # types value (EventView.column_types), so a repeat is an identity check.
        self.prepared: dict[str, Mapping[str, str]] = {}
        # (db, schema, table, types, alias) of the last data event: see index_for.
        self.last: _LastRun | None = None

    def forget_runs(self) -> None:
        """Forget what :meth:`index_for` remembers: an index's columns, or the index
        itself, are about to change."""
        self.prepared.clear()
        self.last = None

    def alias_for(self, ev: EventView) -> str:
        key = (ev.db, ev.schema, ev.table)
        alias = self.aliases.get(key)
        if alias is None:
            alias = alias_name(self.s.index.name_template, *key)
            self.aliases[key] = alias
        return alias

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
            st = self.retry(lambda: self.load_or_create(alias, ev, types), f"open index {alias}")
            self.states[alias] = st
        if types.keys() <= st.columns.keys():
            return st
        new = {c: t for c, t in types.items() if c not in st.columns}
        if new:
            self.retry(lambda: self.add_columns(st, new), f"map new columns of {alias}")
        return st

    def load_or_create(self, alias: str, ev: EventView, types: Mapping[str, str]) -> IndexState:
        index = self.engine.resolve_alias(alias)
        if index is None and registered(self.engine, alias):
            self.lost(alias)  # created before, gone now: never start it over empty
        if index is None:
            meta = {"db": ev.db, "schema": ev.schema, "table": ev.table}
            st = IndexState(alias, index_name(alias), dict(types), 0, meta)
            if self.engine.create_index(
                st.index, alias, self.s.index,
                {**VERIFY_FIELDS, **properties(types, keys=_key_columns(ev))},
                st.to_meta(),
            ):  # fmt: skip
                register(self.engine, alias, st.index)
                log.info("created index %s (alias %s)", st.index, alias)
                return st
            index = self.engine.resolve_alias(alias) or st.index
        props, meta_doc = self.engine.mapping(index)
        if not VERIFY_FIELDS.keys() <= props.keys():  # an index made before them
            self.engine.put_mapping(index, dict(VERIFY_FIELDS))
        self._lengthen_key_keywords(index, props, types, _key_columns(ev))
        w = meta_doc.get("walcast", {})
        meta = {k: v for k, v in w.items() if k not in ("columns", "truncated_lsn")}
        return IndexState(
            alias, index, dict(w.get("columns", {})), int(w.get("truncated_lsn", 0)), meta
        )

    def _lengthen_key_keywords(
        self,
        index: str,
        props: Mapping[str, Any],
        types: Mapping[str, str],
        keys: Collection[str],
    ) -> None:
        """A text key's keyword in an index made before it held long keys (256 characters
        then): lengthened, so that longer keys written from now on are compared by it
        (``repair`` rewrites the ones written before, which ``verify`` reports missing)."""
        want = properties({c: t for c, t in types.items() if c in keys}, keys)
        short = {
            c: m for c, m in want.items()
            if props.get(c, {}).get("fields", {}).get("keyword", {}).get("ignore_above")
            not in (None, m.get("fields", {}).get("keyword", {}).get("ignore_above"))
        }  # fmt: skip
        if not short:
            return
        try:
            self.engine.put_mapping(index, short)
        except Exception as exc:
            if getattr(exc, "status_code", None) != 400:
                raise
            log.warning(
                "index %s keeps the keyword of key columns %s: %s", index, sorted(short), exc
            )

    def add_columns(
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

    def held_state(self, alias: str, ev: EventView) -> IndexState | None:
        """The state of ``alias``'s index if it exists (never creates one)."""
        st = self.states.get(alias)
        if st is None and self.retry(lambda: self.engine.resolve_alias(alias), f"find {alias}"):
            st = self.state(alias, ev, {})
        return st

    def save_meta(self, st: IndexState) -> None:
        self.engine.put_mapping(st.index, {}, st.to_meta())

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


def _key_columns(ev: EventView) -> frozenset[str]:
    """The key's columns as the event names them (none for a keyless table's event)."""
    return frozenset(ev.key) if isinstance(ev.key, dict) else frozenset()
