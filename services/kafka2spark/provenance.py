"""Which rows of a Delta mirror another writer changed (docs/design.md#verification, "A
value changed inside the sink").

Every commit kafka2spark makes carries :data:`~services.kafka2spark.names.WRITER` as its
``userMetadata`` (the Spark session's ``spark.databricks.delta.commitInfo.userMetadata``,
set last in :func:`services.kafka2spark.app.spark_session`). Any other commit that changed
data (an ``add`` or ``remove`` with ``dataChange``) after the table's first tagged commit
is another writer's — an ``UPDATE``, a ``MERGE``, a ``DELETE`` run by hand or by another
job. Delta writes whole files: such a commit removes files and adds their rewritten
copies. A row of an added file that is not equal, column for column, to its key's row in
the files the commit removed was changed (or put there) by that writer: **edited**, and
recorded with kafka2spark's own columns as it left them (its version ``_walcast_lsn``,
row hash and transaction). Rows it only copied along are equal to their old selves, so
they are not.

An edited row is reported while the table's current row for its key still carries those
same own columns: kafka2spark's copy-on-write rewriting the file around another row, or
the whole table for a renamed column, carries it along unchanged, so it stays edited;
once kafka2spark writes the key again (a change, a repair's read row) or deletes it, the
columns change or the row is gone: mended. Nothing else about kafka2spark's commits needs
reading — they are recognised by their tag without being parsed.

What this cannot see: commits older than the log keeps (``delta.logRetentionDuration``,
30 days by default) or than the first tagged commit (a mirror written by an earlier
kafka2spark), and a commit whose files were vacuumed since (``maintain``'s retention, 7
days by default): its rows cannot be compared, so they are not judged, and a warning
says which commit. The continuous mode reads each commit as it comes, so it judges them
before the vacuum. Reading costs one small file per commit (about 16 µs each here) and,
only for another writer's commits, the files they touched.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from services.kafka2spark.names import HASH, LSN, WRITER, XID

log = logging.getLogger(__name__)

Key = tuple[object, ...]
KeyOf = Callable[[dict[str, Any]], Key | None]
"""A row's key as verify compares it; None when a key column is NULL (never a key)."""

_TAG = json.dumps({"userMetadata": WRITER}, separators=(",", ":"))[1:-1]  # as in the log
OWN = (LSN, HASH, XID)
"""kafka2spark's own columns of a row: changed whenever kafka2spark writes the key."""


@dataclass(frozen=True)
class Foreign:
    """A commit of another writer that changed data."""

    version: int
    operation: str


@dataclass
class _Log:
    """What has been read of one table's log: the versions up to ``read``, and the rows
    edited by then (key -> the row as that writer left it, and its commit)."""

    read: int = -1
    tagged: bool = False  # a commit of kafka2spark seen: judging starts after it
    foreign: list[Foreign] = field(default_factory=list)
    edited: dict[Key, tuple[dict[str, Any], Foreign]] = field(default_factory=dict)


class Provenance:
    """The log of each mirror read once, then only its new commits."""

    def __init__(self) -> None:
        self._logs: dict[Path, _Log] = {}

    def foreign_commits(self, path: Path, key_of: KeyOf) -> list[Foreign]:
        """The data-changing commits of other writers in ``path``'s log, oldest first."""
        return list(self._scan(path, key_of).foreign)

    def edited(self, path: Path, key_columns: Sequence[str], key_of: KeyOf) -> dict[Key, Foreign]:
        """The keys whose current row another writer changed, with the commit that did;
        ``key_of`` turns a row (column -> value) into the key verify compares. Edits
        kafka2spark has mended since are forgotten."""
        state = self._scan(path, key_of)
        if not state.edited:
            return {}
        dt = DeltaTable(str(path))
        rows = [row for row, _ in state.edited.values()]
        now: dict[Key, dict[str, Any]] = {}
        for r in _current(dt, key_columns, rows):
            if (k := key_of(r)) is not None:
                now[k] = r
        for k in [k for k, (row, _) in state.edited.items()
                  if k not in now or not _same_own(now[k], row)]:  # fmt: skip
            del state.edited[k]  # written again or deleted by kafka2spark: mended
        return {k: c for k, (_, c) in state.edited.items()}

    def _scan(self, path: Path, key_of: KeyOf) -> _Log:
        state = self._logs.setdefault(path, _Log())
        versions = sorted(
            int(p.stem) for p in (path / "_delta_log").glob("*.json") if p.stem.isdigit()
        )
        schema: pa.Schema | None = None
        for v in versions:
            if v <= state.read:
                continue
            text = (path / "_delta_log" / f"{v:020d}.json").read_text()
            state.read = v
            if _TAG in text:  # kafka2spark's own: nothing to read in it
                state.tagged = True
                continue
            if not state.tagged:
                continue  # before kafka2spark tagged its commits: not judged
            actions = [json.loads(line) for line in text.splitlines() if line.strip()]
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            if info.get("userMetadata") == WRITER:  # the tag written another way
                continue
            added = [a["add"]["path"] for a in actions
                     if "add" in a and a["add"].get("dataChange", True)]  # fmt: skip
            removed = [a["remove"]["path"] for a in actions
                       if "remove" in a and a["remove"].get("dataChange", True)]  # fmt: skip
            if not added:
                continue  # rows deleted only: missing, which the hash sums see
            commit = Foreign(v, str(info.get("operation", "?")))
            state.foreign.append(commit)
            if schema is None:
                schema = DeltaTable(str(path)).to_pyarrow_dataset().schema
            _judge(path, state, commit, added, removed, key_of, schema)
        return state


def _judge(
    path: Path,
    state: _Log,
    commit: Foreign,
    added: list[str],
    removed: list[str],
    key_of: KeyOf,
    schema: pa.Schema,
) -> None:
    """Another writer's commit: each row it wrote that is not its key's row before (in the
    files it removed) is edited; a row edited before and carried along stays so."""
    files = [_local(path, p) for p in [*added, *removed]]
    gone = [f for f in files if not f.exists()]
    if gone:
        log.warning(
            "verify: the files of commit %d (%s) by another writer were vacuumed; the rows"
            " it changed cannot be told apart from those it copied, so they are not judged",
            commit.version, commit.operation,
        )  # fmt: skip
        return
    before: dict[Key, dict[str, Any]] = {}
    for r in _read([_local(path, p) for p in removed], schema):
        if (k := key_of(r)) is not None:
            before[k] = r
    for row in _read([_local(path, p) for p in added], schema):
        k = key_of(row)
        if k is None:
            continue  # a NULL key: not a row verify can compare
        held = state.edited.get(k)
        if held is not None and _same(held[0], row):
            continue  # an earlier edit, carried along
        if not _same(before.get(k), row):
            state.edited[k] = (row, commit)
        elif held is not None:
            del state.edited[k]  # written back as it was before the edit


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Two versions of a row equal column for column (a column one of them lacks counts
    as NULL; NaN equals NaN: a float column's value copied along)."""
    if a is None:
        return False
    return all(_equal(a.get(c), b.get(c)) for c in a.keys() | b.keys())


def _same_own(now: dict[str, Any], edited: dict[str, Any]) -> bool:
    return all(_equal(now.get(c), edited.get(c)) for c in OWN)


def _equal(x: object, y: object) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y, strict=True))
    return x == y


def _local(path: Path, logged: str) -> Path:
    """A data file the log names: relative to the table (URL-encoded), or an absolute
    ``file:`` URI."""
    if logged.startswith("file:"):
        return Path(unquote(logged.removeprefix("file://").removeprefix("file:")))
    return path / unquote(logged)


def _read(files: Sequence[Path], schema: pa.Schema) -> list[dict[str, Any]]:
    """Every row of the data files with the columns each was written with (those of the
    table then: a column renamed since keeps its old name in both of a commit's sides), a
    column the table still has cast to its type now (a timestamp written as INT96 by
    another engine). A deletion vector is not applied: the current rows are checked last."""
    out: list[dict[str, Any]] = []
    for f in files:
        t = pq.read_table(f)
        for i, name in enumerate(t.column_names):
            j = schema.get_field_index(name)
            if j >= 0 and t.schema.field(i).type != schema.field(j).type:
                t = t.set_column(i, name, t.column(i).cast(schema.field(j).type))
        out.extend(t.to_pylist())
    return out


def _current(
    dt: DeltaTable, key_columns: Sequence[str], rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The table's current rows for the keys of ``rows`` (every column)."""
    flt = None
    for column in key_columns:
        values = [r.get(column) for r in rows]
        cond = string_field(column, values).isin(pa.array(values))
        flt = cond if flt is None else flt & cond
    return list(dt.to_pyarrow_dataset().to_table(filter=flt).to_pylist())


def string_field(column: str, values: Sequence[object]) -> pc.Expression:
    """The column in a dataset filter; one of strings read as ``string``: another writer
    (delta-rs) writes them as ``string_view``, which pyarrow's comparisons with a
    ``string`` value, and its pruning by statistics, do not take."""
    field = pc.field(column)
    return field.cast(pa.string()) if any(isinstance(v, str) for v in values) else field
