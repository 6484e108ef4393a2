"""kafka2search's side of ``verify`` (:class:`~shared.verify.core.VerifyTarget`,
docs/design.md#verification): an index compared with its table without reading every
document out of the engine.

- A single integer key's summaries come from ``range`` aggregations: one pass over the
  documents for up to 10,000 ranges (its bounds are doubles: keys beyond 2^53 are summed
  as other keys are).
- Other keys': a range's summary is one search of a multi-search — the range as a query on the key
  fields, its hit count, and the sum and the count of ``_walcast_hash`` (doc values; the
  engine sums in doubles, exact for the at most 2^21 hashes of a range): many ranges per
  request, each search visiting only its range's documents. (One ``filters`` aggregation
  over many ranges was 30 times slower on an index holding deleted documents: the
  engine then tests every document against every filter.)
- A range's rows are its documents' key fields, hash and transaction as doc values, paged
  by the key, with each ``_source`` as the engine keeps it: its stamp says whether another
  writer changed the document (:mod:`services.kafka2search.stamps`). With
  ``verify.values`` every range is read so (a value edited through the engine's API
  leaves the hash sums as they were).
- A marker has been applied once the consumer group's committed offsets pass each of its
  copies (:class:`~shared.verify.marks.GroupMarks`; the loop commits past a control event
  right after writing what came before).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from services.kafka2search.engines import SearchEngine, engine_for
from services.kafka2search.indices import quote_id
from services.kafka2search.key_ranges import range_query
from services.kafka2search.mapping import alias_name, has_key_fields, key_field
from services.kafka2search.settings import Kafka2SearchSettings
from services.kafka2search.stamps import body_intact
from shared.contract.event import ROW_HASH, ROW_XID
from shared.contract.keyorder import INTEGER_KEY_TYPES
from shared.errors import RetriableError, UnverifiableError
from shared.verify.continuous import Continuous, VerifyMetrics
from shared.verify.core import KeyRange, SinkRow, Summary, VerifyTarget, key_value
from shared.verify.marks import GroupMarks, avro_reader
from shared.verify.repair import RepairReport
from shared.verify.run import TableReport
from shared.verify.wiring import (
    KeyShape,
    MakeTarget,
    repair_once,
    verify_continuously,
    verify_once,
)

RANGES_PER_REQUEST = 200
INTEGER_RANGES_PER_REQUEST = 10_000  # buckets of one range aggregation (engines allow 65,535)
_SUMS = {"h": {"sum": {"field": ROW_HASH}}, "n": {"value_count": {"field": ROW_HASH}}}
_EXACT = 2**53  # an engine reads a range aggregation's bounds as doubles


def _exact_in_doubles(ranges: Sequence[KeyRange]) -> bool:
    """Whether every bound of ``ranges`` (single integers) survives as a double."""
    return all(
        b is None or abs(int(b[0])) < _EXACT - 1  # type: ignore[call-overload]
        for r in ranges
        for b in (r.lower, r.upper)
    )


PAGE = 5000


class _Hit(msgspec.Struct):
    source: msgspec.Raw = msgspec.field(name="_source", default=msgspec.Raw(b"{}"))
    fields: dict[str, list[Any]] = {}
    sort: list[Any] = []


class _Hits(msgspec.Struct):
    hits: list[_Hit]


class _Answer(msgspec.Struct):
    hits: _Hits


_ANSWER = msgspec.json.Decoder(_Answer)
"""A search answer with each ``_source`` left as the bytes the engine sent."""


def _summary(rows: Sequence[SinkRow]) -> Summary:
    known = [r.hash for r in rows if r.hash is not None]
    return Summary(len(rows), sum(known), len(rows) - len(known), sum(r.edited for r in rows))


class SearchTarget(VerifyTarget):
    """One engine's indices, as ``settings`` names them for tables of ``database``."""

    def __init__(
        self,
        settings: Kafka2SearchSettings,
        engine: SearchEngine,
        database: str,
        key_shape: KeyShape,
    ) -> None:
        self.s = settings
        self.engine = engine
        self.database = database
        self.key_shape = key_shape
        self._checked: set[tuple[str, str]] = set()
        self.group = GroupMarks(
            settings.kafka.client_config(), settings.consumer.group_id, settings.consumer.topics,
            from_avro=avro_reader(settings.schema_registry),
        )  # fmt: skip

    def close(self) -> None:
        self.group.close()

    def _alias(self, table: tuple[str, str]) -> str | None:
        alias = alias_name(self.s.index.name_template, self.database, *table)
        index = self.engine.resolve_alias(alias)
        if index is None:
            return None
        if table not in self._checked:
            self._check_key_fields(table, index)
            self._checked.add(table)
        self.engine.refresh(alias)
        return alias

    def _check_key_fields(self, table: tuple[str, str], index: str) -> None:
        """An index made before its key's fields were (a date or timestamp key's text,
        :data:`~services.kafka2search.mapping.KEY_TEXT`) holds documents that have none:
        its table is not verified, rather than reported missing."""
        columns, types = self.key_shape(table)
        props, _meta = self.engine.mapping(index)
        lacking = has_key_fields(props, dict(zip(columns, types, strict=True)))
        if lacking:
            raise UnverifiableError(
                f"verify: the index {index} of {'.'.join(table)} was made before this"
                f" version indexed the text of its key column(s) {', '.join(lacking)}, which"
                " verify compares (a date field keeps milliseconds only)",
                hint="an index made by this version has it: reindex the table into a new"
                " index (docs/kafka2search.md#is-my-index-right)",
            )

    def summaries(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[Summary]:
        alias = self._alias(table)
        if alias is None:
            return [Summary(0, 0) for _ in ranges]
        if self.s.verify.values:  # every document read: its stamp checked
            return [_summary(self._documents(alias, table, r)) for r in ranges]
        columns = self._fields(table)
        _names, types = self.key_shape(table)
        if len(columns) == 1 and types[0] in INTEGER_KEY_TYPES and _exact_in_doubles(ranges):
            return self._integer_summaries(alias, columns[0], ranges)
        out: list[Summary] = []
        for start in range(0, len(ranges), RANGES_PER_REQUEST):
            part = ranges[start : start + RANGES_PER_REQUEST]
            searches = b"".join(
                b"{}\n" + json.dumps({
                    "size": 0, "track_total_hits": True, "aggs": _SUMS,
                    "query": range_query(columns, r.lower, r.upper),
                }).encode() + b"\n"
                for r in part
            )  # fmt: skip
            answer = self.engine.request(
                "POST", f"/{alias}/_msearch", body=searches,
                headers={"content-type": "application/x-ndjson"},
            )  # fmt: skip
            for r, got in zip(part, answer["responses"], strict=True):
                if "error" in got:
                    raise RetriableError(
                        f"{alias}: the summary of keys in ({r.lower}, {r.upper}] failed:"
                        f" {json.dumps(got['error'])[:300]}"
                    )
                rows, hashed = (
                    int(got["hits"]["total"]["value"]),
                    int(got["aggregations"]["n"]["value"]),
                )
                out.append(
                    Summary(rows, round(got["aggregations"]["h"]["value"] or 0), rows - hashed)
                )
        return out

    def _integer_summaries(
        self, alias: str, field: str, ranges: Sequence[KeyRange]
    ) -> list[Summary]:
        """A single integer key's summaries from ``range`` aggregations — one pass over
        the documents, each put in its range by a binary search: ``[lower + 1, upper + 1)``
        holds the integers of ``(lower, upper]``."""
        out: list[Summary] = []
        for start in range(0, len(ranges), INTEGER_RANGES_PER_REQUEST):
            part = ranges[start : start + INTEGER_RANGES_PER_REQUEST]
            spans = [
                {**({} if r.lower is None else {"from": int(r.lower[0]) + 1}),  # type: ignore[call-overload]
                 **({} if r.upper is None else {"to": int(r.upper[0]) + 1})}  # type: ignore[call-overload]
                for r in part
            ]  # fmt: skip
            answer = self.engine.request("POST", f"/{alias}/_search", body={
                "size": 0, "track_total_hits": False,
                "aggs": {"r": {"range": {"field": field, "ranges": spans}, "aggs": _SUMS}},
            })  # fmt: skip
            for b in answer["aggregations"]["r"]["buckets"]:
                rows, hashed = int(b["doc_count"]), int(b["n"]["value"])
                out.append(Summary(rows, round(b["h"]["value"] or 0), rows - hashed))
        return out

    def _fields(self, table: tuple[str, str]) -> list[str]:
        """The fields of the key's columns (:func:`~services.kafka2search.mapping.key_field`)."""
        columns, types = self.key_shape(table)
        return [key_field(c, t) for c, t in zip(columns, types, strict=True)]

    def rows(self, table: tuple[str, str], rng: KeyRange) -> list[SinkRow]:
        alias = self._alias(table)
        return [] if alias is None else self._documents(alias, table, rng)

    def _documents(self, alias: str, table: tuple[str, str], rng: KeyRange) -> list[SinkRow]:
        """A range's documents, paged by the key: the key fields, hash and transaction as
        doc values, and ``_source`` as the engine keeps it, to see whether another writer
        changed it (:func:`~services.kafka2search.stamps.body_intact`)."""
        _columns, types = self.key_shape(table)
        columns = self._fields(table)
        body: dict[str, Any] = {
            "size": PAGE, "query": range_query(columns, rng.lower, rng.upper),
            "docvalue_fields": [*columns, ROW_HASH, ROW_XID],
            "sort": [{c: "asc"} for c in columns], "track_total_hits": False,
        }  # fmt: skip
        out: list[SinkRow] = []
        while True:
            raw = self.engine.request_raw("POST", f"/{alias}/_search", body=body)
            hits = _ANSWER.decode(raw).hits.hits
            for h in hits:
                f = h.fields
                if not all(c in f for c in columns):
                    continue  # no key fields: not a row of the table's key (never ours)
                key = tuple(key_value(t, f[c][0]) for c, t in zip(columns, types, strict=True))
                row_hash = f.get(ROW_HASH, [None])[0]
                xid = f.get(ROW_XID, [0])[0]
                edited = body_intact(h.source) is False
                out.append(
                    SinkRow(key, None if row_hash is None else int(row_hash), int(xid), edited)
                )
            if len(hits) < PAGE:
                return out
            body["search_after"] = hits[-1].sort

    def prefetch(self, table: tuple[str, str]) -> None:
        """Nothing: the engine answers the summaries in one pass when they are asked for."""

    def before_mark(self, tables: Sequence[tuple[str, str]]) -> None:
        self.group.before_mark()

    def wait_for_mark(
        self, mark_id: str, tables: Sequence[tuple[str, str]], timeout_s: float
    ) -> None:
        self.group.wait_for_mark("kafka2search", mark_id, tables, timeout_s)


def indexed_tables(settings: Kafka2SearchSettings, engine: SearchEngine) -> list[tuple[str, str]]:
    """The (schema, table) of every index this service's template names, from the
    ``_meta`` each index records (what ``verify`` checks when no table is named)."""
    out: set[tuple[str, str]] = set()
    pattern = settings.index.name_template.format(db="*", schema="*", table="*").lower()
    for index in engine.aliases(pattern).values():
        _props, meta = engine.mapping(index)
        w = meta.get("walcast", {})
        if isinstance(w.get("schema"), str) and isinstance(w.get("table"), str):
            out.add((w["schema"], w["table"]))
    return sorted(out)


R = TypeVar("R")


def _on_engine(
    settings: Kafka2SearchSettings,
    tables: Sequence[tuple[str, str]],
    run: Callable[[MakeTarget, list[tuple[str, str]]], R],
) -> R:
    """``run`` with the engine's targets and the tables (every indexed one when none is
    named), the engine closed after."""
    engine = engine_for(settings.engine)
    try:
        chosen = list(tables) or indexed_tables(settings, engine)
        return run(lambda db, key_shape: SearchTarget(settings, engine, db, key_shape), chosen)
    finally:
        engine.close()


def verify(
    settings: Kafka2SearchSettings,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[TableReport], None] | None = None,
) -> list[TableReport]:
    """Compare each table (all the service's indices when none is named) with Postgres."""
    return _on_engine(settings, tables, lambda make, chosen: verify_once(
        settings.verify, "kafka2search", make, chosen, progress,
        settings.consumer.input_format))  # fmt: skip


def repair(
    settings: Kafka2SearchSettings,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[str], None] | None = None,
) -> list[RepairReport]:
    """Verify each table (all the service's indices when none is named) and repair what
    differs."""
    return _on_engine(settings, tables, lambda make, chosen: repair_once(
        settings.verify, "kafka2search", make, chosen, progress,
        settings.consumer.input_format))  # fmt: skip


VERIFY_INDEX = "walcast-kafka2search-verify"
"""The last verification of each table per consumer group (what ``status`` shows): one
document each, its report as JSON text (never mapped field by field)."""


def record_outcome(engine: SearchEngine, group: str, outcome: dict[str, Any]) -> None:
    """Keep a table's last verification where ``status`` reads it."""
    doc_id = quote_id(f"{group}:{outcome['table']}")
    engine.request(
        "PUT",
        f"/{VERIFY_INDEX}/_doc/{doc_id}",
        body={"group": group, "table": outcome["table"], "report": json.dumps(outcome)},
    )


def last_outcomes(engine: SearchEngine, group: str) -> list[dict[str, Any]]:
    """Each table's last verification by ``group``'s continuous mode, by table. The
    index the first outcome just created answers 503 until its shard has started: then
    this waits (at most 30 s) for the shard, and asks once more."""
    search = {"size": 1000, "query": {"term": {"group.keyword": group}}}
    try:
        answer = engine.request("POST", f"/{VERIFY_INDEX}/_search", body=search)
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        if status == 404:
            return []  # never verified
        if status != 503:
            raise
        engine.request(
            "GET",
            f"/_cluster/health/{VERIFY_INDEX}",
            params={"wait_for_status": "yellow", "timeout": "30s"},
        )
        answer = engine.request("POST", f"/{VERIFY_INDEX}/_search", body=search)
    out = [json.loads(h["_source"]["report"]) for h in answer["hits"]["hits"]]
    return sorted(out, key=lambda o: str(o.get("table")))


def continuous(
    settings: Kafka2SearchSettings,
    engine: SearchEngine,
    metrics: VerifyMetrics,
    stop: threading.Event,
) -> Continuous | None:
    """The continuous mode when ``verify.interval_s`` is set (None otherwise)."""
    group = settings.consumer.group_id
    return verify_continuously(
        settings.verify, "kafka2search",
        lambda db, key_shape: SearchTarget(settings, engine, db, key_shape),
        lambda: indexed_tables(settings, engine), metrics,
        lambda outcome: record_outcome(engine, group, outcome), stop,
        settings.consumer.input_format,
    )  # fmt: skip
