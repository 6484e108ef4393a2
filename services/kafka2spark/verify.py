"""kafka2spark's side of ``verify`` (:class:`~shared.verify.core.VerifyTarget`,
docs/design.md#verification): a Delta mirror compared with its table without a JVM.

The mirror is read with ``deltalake`` (delta-rs), three kinds of column only — the key,
``_walcast_hash``, ``_walcast_xid`` — never the rows' values: Parquet's columnar layout
makes that a fraction of a full read. Summaries of every range come from one read of the
key and hash columns (a single integer key in numpy, other keys — uuid, text, composite —
as tuples sorted once; strings in code point order, as Postgres's side reads them);
a range's rows from a read filtered to it (files outside it skipped by their
statistics). The marker has been applied once the source group's committed offsets pass
it: kafka2spark commits each batch's offsets there after the batch's Delta commits.
"""

from __future__ import annotations

import bisect
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import date, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from services.kafka2spark.names import HASH, XID, postgres_name, table_dir
from services.kafka2spark.provenance import Provenance, string_field
from services.kafka2spark.settings import Kafka2SparkSettings
from shared.contract.keyorder import INTEGER_KEY_TYPES, TIME_KEY_TYPES
from shared.errors import PermanentError
from shared.verify.continuous import Continuous, VerifyMetrics
from shared.verify.core import (
    Key,
    KeyRange,
    SinkRow,
    Summary,
    VerifyTarget,
    key_order,
    key_value,
)
from shared.verify.marks import GroupMarks, avro_reader
from shared.verify.repair import RepairReport
from shared.verify.run import TableReport
from shared.verify.wiring import KeyShape, repair_once, verify_continuously, verify_once

_Read = tuple[list[pa.Array], pa.Array, pa.Array, tuple[str, ...]]


class DeltaTarget(VerifyTarget):
    """The mirrors under ``settings.delta.root`` of tables of ``database``."""

    def __init__(self, settings: Kafka2SparkSettings, database: str, key_shape: KeyShape) -> None:
        self.s = settings
        self.database = database
        self.key_shape = key_shape
        self.provenance = Provenance()
        self._ahead: dict[tuple[str, str], tuple[int, _Read | None]] = {}
        self.group = GroupMarks(
            settings.kafka.client_config(), settings.source.group_id, settings.source.topics,
            from_avro=avro_reader(settings.schema_registry),
        )  # fmt: skip

    def close(self) -> None:
        self.group.close()

    def path(self, table: tuple[str, str]) -> Path:
        return self.s.delta.root / table_dir(self.s.delta.table_template, self.database, *table)

    def prefetch(self, table: tuple[str, str]) -> None:
        """Read the key and hash columns for the summaries now, while the marker is
        awaited, noting the mirror's version: the summaries use them only if the mirror
        is still at that version once the marker was applied (no commit since: the state
        read is the state after the marker)."""
        path = self.path(table)
        version = _latest_version(path)
        if version is None:
            return
        dt = DeltaTable(str(path), version=version)
        self._ahead[table] = (version, self._read(table, summaries_only=True, dt=dt))

    def _summary_read(self, table: tuple[str, str]) -> _Read | None:
        ahead = self._ahead.pop(table, None)
        if ahead is not None and ahead[0] == _latest_version(self.path(table)):
            return ahead[1]
        return self._read(table, summaries_only=True)

    def _read(
        self,
        table: tuple[str, str],
        rng: KeyRange | None = None,
        summaries_only: bool = False,
        dt: DeltaTable | None = None,
    ) -> _Read | None:
        """(key columns, hashes, xids, key types) of the mirror's rows (in ``rng``), or
        None when the table has no mirror; ``summaries_only``: the xids not read (nulls);
        ``dt``: the mirror at a version (default: the latest)."""
        path = self.path(table)
        if not (path / "_delta_log").is_dir():
            return None
        columns, types = self.key_shape(table)
        dt = DeltaTable(str(path)) if dt is None else dt
        by_pg = {postgres_name(f.name): f.name for f in dt.schema().fields}
        missing = [c for c in columns if c not in by_pg]
        if missing or HASH not in by_pg.values():
            raise PermanentError(
                f"verify: the mirror of {'.'.join(table)} at {path} lacks"
                f" {', '.join(missing) or HASH}",
                hint="it is verified once kafka2spark (this version) has written a batch to it",
            )
        names = [by_pg[c] for c in columns]
        dataset = dt.to_pyarrow_dataset()
        flt = None if rng is None else _filter(names, types, rng)
        wanted = [*names, HASH] if summaries_only else [*names, HASH, XID]
        t = dataset.to_table(columns=wanted, filter=flt)
        xids = pa.nulls(t.num_rows, pa.int64()) if summaries_only else t.column(XID)
        return [t.column(n) for n in names], t.column(HASH), xids, types

    def _edited(self, table: tuple[str, str]) -> set[Key]:
        """The keys whose row another writer changed in the mirror (found in its log:
        :mod:`services.kafka2spark.provenance`)."""
        path = self.path(table)
        columns, types = self.key_shape(table)
        by_pg = {postgres_name(f.name): f.name for f in DeltaTable(str(path)).schema().fields}
        names = [by_pg[c] for c in columns]

        def key_of(row: dict[str, Any]) -> Key | None:
            values = [row.get(n) for n in names]
            if any(v is None for v in values):
                return None  # a NULL key: never one verify compares
            return tuple(key_value(t, v) for v, t in zip(values, types, strict=True))

        return set(self.provenance.edited(path, names, key_of))

    def summaries(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[Summary]:
        out = self._summaries(table, ranges)
        if not out or not any(s.rows for s in out):
            return out
        edited = self._edited(table)
        if not edited:
            return out
        # ranges are contiguous, in key order, the last unbounded above
        uppers = [key_order(r.upper) for r in ranges if r.upper is not None]
        counts = [0] * len(ranges)
        for key in edited:
            counts[min(bisect.bisect_left(uppers, key_order(key)), len(ranges) - 1)] += 1
        return [replace(s, edited=n) for s, n in zip(out, counts, strict=True)]

    def _summaries(self, table: tuple[str, str], ranges: Sequence[KeyRange]) -> list[Summary]:
        read = self._summary_read(table)
        if read is None:
            return [Summary(0, 0) for _ in ranges]
        keys, hashes, _xids, types = read
        known = pc.is_valid(hashes).to_numpy(zero_copy_only=False)
        h = pc.fill_null(hashes, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        if len(keys) == 1 and types[0] in INTEGER_KEY_TYPES:
            k = pc.fill_null(keys[0], 0).to_numpy(zero_copy_only=False).astype(np.int64)
            return _integer_summaries(k, h, known, ranges)
        # Other keys: tuples in Python, sorted once.
        values = [c.to_pylist() for c in keys]
        tuples = [
            tuple(key_value(t, v) for t, v in zip(types, vals, strict=True))
            for vals in zip(*values, strict=True)
        ]
        order_i = sorted(range(len(tuples)), key=lambda i: tuples[i])
        sorted_keys = [tuples[i] for i in order_i]
        hs = [int(h[i]) for i in order_i]
        ks = [bool(known[i]) for i in order_i]
        cum_hs, cum_ks = [0], [0]
        for x, y in zip(hs, ks, strict=True):
            cum_hs.append(cum_hs[-1] + x)
            cum_ks.append(cum_ks[-1] + int(y))
        out = []
        for r in ranges:
            a = 0 if r.lower is None else bisect.bisect_right(sorted_keys, r.lower)
            b = len(sorted_keys) if r.upper is None else bisect.bisect_right(sorted_keys, r.upper)
            rows = b - a
            out.append(Summary(rows, cum_hs[b] - cum_hs[a], rows - (cum_ks[b] - cum_ks[a])))
        return out

    def rows(self, table: tuple[str, str], rng: KeyRange) -> list[SinkRow]:
        read = self._read(table, rng)
        if read is None:
            return []
        keys, hashes, xids, types = read
        edited = self._edited(table)
        out = []
        for *vals, row_hash, xid in zip(*(c.to_pylist() for c in keys), hashes.to_pylist(),
                                       xids.to_pylist(), strict=True):  # fmt: skip
            key = tuple(key_value(t, v) for t, v in zip(types, vals, strict=True))
            out.append(SinkRow(key, row_hash, int(xid or 0), key in edited))
        return out

    def before_mark(self, tables: Sequence[tuple[str, str]]) -> None:
        self.group.before_mark()

    def wait_for_mark(
        self, mark_id: str, tables: Sequence[tuple[str, str]], timeout_s: float
    ) -> None:
        self.group.wait_for_mark("kafka2spark", mark_id, tables, timeout_s)


def _integer_summaries(
    k: np.ndarray, h: np.ndarray, known: np.ndarray, ranges: Sequence[KeyRange]
) -> list[Summary]:
    """Summaries for a single integer key. The ranges of a whole table (contiguous, in key
    order, unbounded at both ends) take one pass and no sort: each row's range is found
    among the upper bounds (a binary search per row), then counted and summed per range
    (``bincount``; its sums are doubles, exact below 2^53: a range of at most 2^21 hashes
    under 2^32, and a range holding more rows than that differs by its count anyway).
    Other ranges: the keys sorted once, each range found by its bounds."""
    contiguous = (
        len(ranges) > 0 and ranges[0].lower is None and ranges[-1].upper is None
        and all(a.upper == b.lower for a, b in itertools.pairwise(ranges))
    )  # fmt: skip
    if contiguous:
        bounds = [r.upper[0] for r in ranges[:-1] if r.upper is not None]
        uppers = np.array(bounds, dtype=np.int64)
        at = np.searchsorted(uppers, k, side="left")  # the first upper at or above the key
        n = len(ranges)
        rows = np.bincount(at, minlength=n)
        sums = np.bincount(at, weights=h, minlength=n)
        hashed = np.bincount(at, weights=known, minlength=n)
        return [
            Summary(int(rows[i]), round(sums[i]), int(rows[i]) - round(hashed[i])) for i in range(n)
        ]
    order = np.argsort(k, kind="stable")
    k, h, known = k[order], h[order], known[order]
    cum_h = np.concatenate(([0], np.cumsum(h)))
    cum_k = np.concatenate(([0], np.cumsum(known)))

    def at_bound(bound: Key | None, default: int) -> int:
        if bound is None:
            return default
        return int(np.searchsorted(k, int(bound[0]), side="right"))  # type: ignore[call-overload]

    out = []
    for r in ranges:
        a, b = at_bound(r.lower, 0), at_bound(r.upper, len(k))
        rows_in = b - a
        out.append(Summary(rows_in, int(cum_h[b] - cum_h[a]), rows_in - int(cum_k[b] - cum_k[a])))
    return out


def key_time(pg_type: str, text: str) -> pa.Scalar:
    """A date or timestamp key's text (:func:`~shared.contract.keyorder.key_text`) as the
    value the mirror holds: a date, a timestamp without time zone, one in UTC."""
    if pg_type == "date":
        return pa.scalar(date.fromisoformat(text), pa.date32())
    if pg_type == "timestamp":
        return pa.scalar(datetime.fromisoformat(text), pa.timestamp("us"))
    return pa.scalar(datetime.fromisoformat(text), pa.timestamp("us", tz="UTC"))


def _latest_version(path: Path) -> int | None:
    """The mirror's latest version — its highest commit file (each commit adds the next
    one, atomically) — or None before its first commit."""
    versions = [int(p.stem) for p in (path / "_delta_log").glob("*.json") if p.stem.isdigit()]
    return max(versions) if versions else None


def _filter(names: Sequence[str], types: Sequence[str], rng: KeyRange) -> Any:
    """A dataset filter for the keys in ``rng`` (lexicographic over the key's columns)."""

    def lit(t: str, v: object) -> object:
        if t in TIME_KEY_TYPES:  # the mirror's date or timestamp (a bound is its text)
            return key_time(t, str(v))
        return v if t in INTEGER_KEY_TYPES else str(v)  # uuid as its text, text as is

    def beyond(i: int, bound: Key, strict_last: str) -> Any:
        v = lit(types[i], bound[i])
        f = string_field(names[i], [v])
        if i == len(names) - 1:
            return f > v if strict_last == "gt" else f <= v
        first = f > v if strict_last == "gt" else f < v
        return first | ((f == v) & beyond(i + 1, bound, strict_last))

    parts = []
    if rng.lower is not None:
        parts.append(beyond(0, rng.lower, "gt"))
    if rng.upper is not None:
        parts.append(beyond(0, rng.upper, "lte"))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0] & parts[1]


def mirrored_tables(settings: Kafka2SparkSettings) -> list[tuple[str, str]]:
    """The (schema, table) of every mirror kafka2spark keeps (its mirror list)."""
    from services.kafka2spark.held import read_mirrors

    out = set()
    for name in read_mirrors(settings.delta.root):
        _db, schema, table = name.split(".", 2)
        out.add((schema, table))
    return sorted(out)


def verify(
    settings: Kafka2SparkSettings,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[TableReport], None] | None = None,
) -> list[TableReport]:
    """Compare each table (every mirror when none is named) with Postgres."""
    return verify_once(
        settings.verify, "kafka2spark",
        lambda db, key_shape: DeltaTarget(settings, db, key_shape),
        list(tables) or mirrored_tables(settings), progress, settings.source.input_format,
    )  # fmt: skip


def repair(
    settings: Kafka2SparkSettings,
    tables: Sequence[tuple[str, str]],
    progress: Callable[[str], None] | None = None,
) -> list[RepairReport]:
    """Verify each table (every mirror when none is named) and repair what differs."""
    return repair_once(
        settings.verify, "kafka2spark",
        lambda db, key_shape: DeltaTarget(settings, db, key_shape),
        list(tables) or mirrored_tables(settings), progress, settings.source.input_format,
    )  # fmt: skip


def outcomes_path(settings: Kafka2SparkSettings) -> Path:
    """Each table's last verification by the continuous mode (what ``status`` shows)."""
    return settings.delta.root / "_walcast_verify.json"


def record_outcome(settings: Kafka2SparkSettings, outcome: dict[str, Any]) -> None:
    path = outcomes_path(settings)
    known = last_outcomes(settings)
    known = [o for o in known if o.get("table") != outcome["table"]] + [outcome]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(known, key=lambda o: str(o.get("table")))))
    tmp.replace(path)  # never half written


def last_outcomes(settings: Kafka2SparkSettings) -> list[dict[str, Any]]:
    path = outcomes_path(settings)
    if not path.exists():
        return []
    out: list[dict[str, Any]] = json.loads(path.read_text())
    return out


def continuous(
    settings: Kafka2SparkSettings, metrics: VerifyMetrics, stop: threading.Event
) -> Continuous | None:
    """The continuous mode when ``verify.interval_s`` is set (None otherwise)."""
    return verify_continuously(
        settings.verify, "kafka2spark",
        lambda db, key_shape: DeltaTarget(settings, db, key_shape),
        lambda: mirrored_tables(settings), metrics,
        lambda outcome: record_outcome(settings, outcome), stop, settings.source.input_format,
    )  # fmt: skip
