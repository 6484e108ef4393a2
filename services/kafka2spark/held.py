"""Held tables: the mirrors that failed, kept apart so the other tables go on.

A table's mirror that cannot take a batch (a schema Delta or Spark refuses, a column it
cannot hold) used to fail the batch; Spark ran the same batch again on restart, so every
table stopped. Such a table is now *held*: recorded here with the reason, and its events
go to the quarantine (in order, with the reason) until an operator releases it. The
file lives under ``delta.root`` and is replaced atomically. No pyspark import: the
``status`` and ``release`` commands read it without a Spark session.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HELD_FILE = "_walcast_held_tables.json"


def held_path(root: Path) -> Path:
    return root / HELD_FILE


def read_held(root: Path) -> dict[str, dict[str, Any]]:
    """``db.schema.table`` -> ``{"reason": ..., "batch_id": ...}``."""
    try:
        held: dict[str, dict[str, Any]] = json.loads(held_path(root).read_text())
    except (FileNotFoundError, NotADirectoryError):  # nothing held yet (or no root: Spark says)
        return {}
    return held


def write_held(root: Path, held: dict[str, dict[str, Any]]) -> None:
    path = held_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(held, indent=2, sort_keys=True))
    tmp.replace(path)  # a crash leaves the old file or the new one


def release(root: Path, table: str) -> bool:
    """Let ``table`` (``db.schema.table``) be mirrored again; False if it was not held.
    Its changes while held are in the quarantine, not in the mirror: bring its rows back
    (a re-snapshot, or a replay into an emptied mirror)."""
    held = read_held(root)
    if held.pop(table, None) is None:
        return False
    write_held(root, held)
    forget_mirror(root, table)  # a mirror deleted on purpose may be created again
    return True


MIRRORS_FILE = "_walcast_mirrors.json"


def read_mirrors(root: Path) -> set[str]:
    """Tables whose mirror kafka2spark created (``db.schema.table``): a registered mirror
    that is missing was deleted outside walcast, and is never created again, partial."""
    try:
        return set(json.loads((root / MIRRORS_FILE).read_text()))
    except (FileNotFoundError, NotADirectoryError):  # none yet (or no root: Spark says)
        return set()


def add_mirror(root: Path, table: str) -> None:
    known = read_mirrors(root)
    if table in known:
        return
    path = root / MIRRORS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(known | {table}), indent=2))
    tmp.replace(path)


def forget_mirror(root: Path, table: str) -> None:
    """After a release: the table's mirror may be created again (to be filled again)."""
    known = read_mirrors(root)
    if table in known:
        path = root / MIRRORS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(known - {table}), indent=2))
        tmp.replace(path)
