"""Failpoints: named places where a test makes a service fail at the worst moment.

A kill at "some moment during a snapshot" is timing; a kill right after the third chunk
was sent to Kafka but before it was recorded is a failpoint. Tests name the place and the
action in ``WALCAST_FAILPOINTS`` in a service process's environment::

    WALCAST_FAILPOINTS="incremental.chunk_sent=exit@3;snapshot.chunk_done=raise"

Actions: ``exit`` ends the process at once with :data:`EXIT_CODE` — ``os._exit``: no
cleanup, nothing flushed, no offset committed or LSN confirmed, as a SIGKILL; ``raise``
raises :class:`FailpointError` (a crash through the service's own error path); ``term``
sends the process SIGTERM and goes on (a stop asked at that very moment: the service's
own shutdown path). ``@N``
fires on the N-th time the place is reached (default: the first). Each place fires once
per process.

The variable is read once, on the first :func:`failpoint` call — the one place library
code reads the environment, because a test tool must reach every process a test starts.
Unset (production), a call costs one dictionary lookup. The places are listed in
docs/development.md ("Failpoints"); they are:

- ``snapshot.chunk_sent`` / ``snapshot.chunk_done``: an initial snapshot's chunk sent to
  Kafka / recorded as done (pg2kafka);
- ``incremental.chunk_read`` / ``incremental.chunk_sent`` / ``incremental.chunk_done``:
  an incremental snapshot's chunk read / sent / recorded (pg2kafka);
- ``consumer.batch_written``: a batch written by the sink (kafka2search: the bulk
  request answered; kafka2webhook: delivered), its offsets not yet committed;
- ``kafka2spark.batch_started``: a micro-batch handed to the mirror, nothing of it
  written yet;
- ``kafka2spark.batch_written``: a micro-batch written to Delta, neither its offsets
  committed to the group nor Spark's checkpoint written;
- ``kafka2postgres.applied``: a table's rows of a batch applied inside the target
  transaction, not yet committed (nor any offset);
- ``verify.marked``: a verification's marker committed in Postgres, the sink not yet
  waited for (``verify``, ``repair`` and the continuous mode);
- ``repair.requested``: a repair's snapshot of key ranges filed, not yet waited for.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from shared.errors import WalcastError

log = logging.getLogger(__name__)

ENV = "WALCAST_FAILPOINTS"
EXIT_CODE = 86


class FailpointError(WalcastError):
    """Raised by a failpoint with the ``raise`` action (tests only)."""


_lock = threading.Lock()
_armed: dict[str, tuple[str, int]] | None = None
_hits: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    armed: dict[str, tuple[str, int]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, sep, action = part.partition("=")
        kind, _, nth = action.partition("@")
        if not sep or kind not in ("exit", "raise", "term") or (nth and not nth.isdigit()):
            raise ValueError(
                f"{ENV}: {part!r} is not name=exit|raise|term[@N]"
                " (e.g. incremental.chunk_sent=exit@3)"
            )
        armed[name.strip()] = (kind, int(nth or 1))
    return armed


def failpoint(name: str) -> None:
    """The service reached place ``name``: fail there if a test armed it."""
    global _armed
    armed = _armed
    if armed is None:
        with _lock:
            if _armed is None:
                _armed = _parse(os.environ.get(ENV, ""))
            armed = _armed
    if not armed or name not in armed:
        return
    kind, nth = armed[name]
    with _lock:
        _hits[name] = hit = _hits.get(name, 0) + 1
    if hit != nth:
        return
    if kind == "raise":
        raise FailpointError(f"failpoint {name} (hit {hit})")
    if kind == "term":
        log.warning("failpoint %s (hit %d): SIGTERM to this process", name, hit)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    log.warning("failpoint %s (hit %d): exiting at once", name, hit)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_CODE)


__all__ = ["ENV", "EXIT_CODE", "FailpointError", "failpoint"]
