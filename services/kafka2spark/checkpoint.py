"""The streaming query's checkpoint directory, before the query starts.

A query that never recorded a batch has nothing to resume from, yet a kill while Spark
wrote its first batch's offsets (``offsets/0``, written to a temporary file and renamed)
leaves that temporary file behind. Spark 4 refuses to start a new query over a
non-empty ``offsets``, ``commits`` or ``state`` directory
(``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``) — at every restart, for good: one kill
at the wrong moment stopped the mirror until an operator cleared the directory by hand.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

_LOGS = ("offsets", "commits")


def _batches(directory: Path) -> list[Path]:
    """The batch files of a metadata log (named by their batch number)."""
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if p.name.isdigit()]


def clear_unstarted(checkpoint: Path) -> list[Path]:
    """Remove what a query that never recorded a batch left in ``checkpoint``'s offsets
    and commit logs (temporary files of an interrupted first write). Does nothing once
    ``offsets`` holds a batch: then the query resumes from it, and nothing is touched.
    Returns what was removed (logged as a warning)."""
    if _batches(checkpoint / "offsets"):
        return []
    removed: list[Path] = []
    for name in _LOGS:
        directory = checkpoint / name
        if not directory.is_dir():
            continue
        for leftover in sorted(directory.iterdir()):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
            removed.append(leftover)
    if removed:
        log.warning(
            "checkpoint %s recorded no batch yet holds %d leftover file(s) of an interrupted"
            " first write (%s): removed, so the query can start",
            checkpoint, len(removed), ", ".join(p.name for p in removed[:5]),
        )  # fmt: skip
    return removed
