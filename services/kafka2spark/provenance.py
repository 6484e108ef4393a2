"""Which rows of a Delta mirror another writer changed (docs/design.md#verification, "A
value changed inside the sink").

Every commit kafka2spark makes carries :data:`WRITER` as its ``userMetadata`` (the Spark
session's ``spark.databricks.delta.commitInfo.userMetadata``, set last in
:func:`services.kafka2spark.app.spark_session`). Any other commit that changed data (an
``add`` with ``dataChange``) after the table's first tagged commit is another writer's —
an ``UPDATE``, a ``MERGE``, a ``DELETE`` run by hand or by another job. Delta writes
whole files: such a commit removes files and adds their rewritten copies. A row of an
added file that is not equal, column for column, to its key's row in the files the commit
removed was changed (or put there) by that writer: **edited**. Rows it only copied along
are equal to their old selves, so they are not. An edited row stays edited while later
commits — another writer's, or kafka2spark's own copy-on-write rewriting the file around
another row — carry it along unchanged; it is mended once kafka2spark writes its key
again (or deletes it). Last, an edited row counts only if it is still the table's current
row for its key.

What this cannot see: commits older than the log keeps (``delta.logRetentionDuration``,
30 days by default) or older than the first tagged commit (mirrors written by an earlier
kafka2spark); a removed file already vacuumed leaves its commit's rows without an old self
to compare with, so they all count as edited (a repair reads them again: harmless).
Reading costs the log's JSON commits (each parsed once per target) and, only when another
writer committed, the files it added and removed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from services.kafka2spark.names import WRITER

_TAG = json.dumps({"userMetadata": WRITER}, separators=(",", ":"))[1:-1]  # as in the log

Key = tuple[object, ...]
KeyOf = Callable[[dict[str, Any]], Key]


@dataclass(frozen=True)
class Foreign:
    """A commit of another writer that changed data."""

    version: int
    operation: str


@dataclass
class _Log:
    """What has been read of one table's log: the versions up to ``read``, and the rows
    edited by then (key -> the row, the commit that wrote it, the file that holds it)."""

    read: int = -1
    tagged: bool = False  # a commit of kafka2spark seen: judging starts after it
    foreign: list[Foreign] = field(default_factory=list)
    edited: dict[Key, tuple[dict[str, Any], Foreign, str]] = field(default_factory=dict)


class Provenance:
    """The log of each mirror read once, then only its new commits."""

    def __init__(self) -> None:
        self._logs: dict[Path, _Log] = {}

    def foreign_commits(self, path: Path, key_of: KeyOf) -> list[Foreign]:
        """The data-changing commits of other writers in ``path``'s log, oldest first."""
        return list(self._scan(path, key_of).foreign)

    def edited(self, path: Path, key_columns: Sequence[str], key_of: KeyOf) -> dict[Key, Foreign]:
        """The keys whose current row another writer changed, with the commit that did;
        ``key_of`` turns a row (column -> value) into the key verify compares."""
        log = self._scan(path, key_of)
        if not log.edited:
            return {}
        dt = DeltaTable(str(path))
        rows = [row for row, _, _ in log.edited.values()]
        now = {key_of(r): r for r in _current(dt, key_columns, rows)}
        return {k: c for k, (row, c, _) in log.edited.items() if k in now and _same(now[k], row)}

    def _scan(self, path: Path, key_of: KeyOf) -> _Log:
        log = self._logs.setdefault(path, _Log())
        versions = sorted(
            int(p.stem) for p in (path / "_delta_log").glob("*.json") if p.stem.isdigit()
        )
        for v in versions:
            if v <= log.read:
                continue
            text = (path / "_delta_log" / f"{v:020d}.json").read_text()
            log.read = v
            if log.tagged and not log.edited and _TAG in text:
                continue  # kafka2spark's, with no edited row to follow: not even parsed
            actions = [json.loads(line) for line in text.splitlines() if line.strip()]
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            ours = info.get("userMetadata") == WRITER
            log.tagged = log.tagged or ours
            if not log.tagged:
                continue  # before kafka2spark tagged its commits: not judged
            added = [a["add"]["path"] for a in actions
                     if "add" in a and a["add"].get("dataChange", True)]  # fmt: skip
            removed = {a["remove"]["path"] for a in actions
                       if "remove" in a and a["remove"].get("dataChange", True)}  # fmt: skip
            if ours:
                _follow(path, log, added, removed, key_of)
            elif added or removed:
                commit = Foreign(v, str(info.get("operation", "?")))
                log.foreign.append(commit)
                _judge(path, log, commit, added, removed, key_of)
        return log


def _follow(path: Path, log: _Log, added: list[str], removed: set[str], key_of: KeyOf) -> None:
    """A commit of kafka2spark: an edited row in a file it replaced is still edited if it
    copied the row along unchanged, mended if it wrote the key again or deleted it."""
    touched = {k for k, (_, _, f) in log.edited.items() if f in removed}
    if not touched:
        return
    post: dict[Key, list[tuple[dict[str, Any], str]]] = {}
    for f in added:
        for row in _read(path, [f]):
            if (k := key_of(row)) in touched:
                post.setdefault(k, []).append((row, f))
    for k in touched:
        row, commit, _ = log.edited[k]
        copies = post.get(k, [])
        if copies and all(_same(r, row) for r, _ in copies):
            log.edited[k] = (row, commit, copies[0][1])
        else:
            del log.edited[k]


def _judge(
    path: Path, log: _Log, commit: Foreign, added: list[str], removed: set[str], key_of: KeyOf
) -> None:
    """Another writer's commit: each row it wrote that is not its key's row before (in the
    files it removed) is edited; a row edited before and carried along stays so."""
    before = {key_of(r): r for r in _read(path, sorted(removed))}
    gone = {k for k, (_, _, f) in log.edited.items() if f in removed}
    for f in added:
        for row in _read(path, [f]):
            k = key_of(row)
            gone.discard(k)
            held = log.edited.get(k)
            if held is not None and _same(held[0], row):
                log.edited[k] = (held[0], held[1], f)  # carried along
            elif not _same(before.get(k), row):
                log.edited[k] = (row, commit, f)
            elif held is not None:
                del log.edited[k]  # written back as it was before the edit
    for k in gone:  # deleted by this writer: missing, which the hash sums see
        del log.edited[k]


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Two versions of a row equal column for column (a column one of them lacks — added
    after the other was written — counts as NULL)."""
    if a is None:
        return False
    return all(a.get(c) == b.get(c) for c in a.keys() | b.keys())


def _read(path: Path, relative: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of the data files still on disk (a deletion vector not applied: the
    current rows are checked last, by :func:`_current`)."""
    out: list[dict[str, Any]] = []
    for p in relative:
        f = path / unquote(p)
        if f.exists():
            out.extend(pq.read_table(f).to_pylist())
    return out


def _current(
    dt: DeltaTable, key_columns: Sequence[str], rows: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The table's current rows for the keys of ``rows`` (every column)."""
    flt = None
    for column in key_columns:
        cond = pc.field(column).isin(pa.array([r.get(column) for r in rows]))
        flt = cond if flt is None else flt & cond
    return list(dt.to_pyarrow_dataset().to_table(filter=flt).to_pylist())
