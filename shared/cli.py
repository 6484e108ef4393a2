"""What every service's command line does around its commands: load and validate the
settings (exit 2 on a bad one), set up logging with secrets masked, and turn a permanent
failure into one line saying what to fix (exit 1). A retriable failure that escapes a
command is a bug and keeps its traceback.

Everything this module writes — log lines, the error line on stderr, the traceback of an
uncaught exception (any thread) — is scrubbed of the loaded settings' secrets and of URL
passwords (:mod:`shared.secrets`): error text from drivers may carry what they were
given."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from pydantic import BaseModel

from shared.errors import (
    ConfigError,
    RetriesExhaustedError,
    Verdict,
    WalcastError,
    classify,
    operator_hint,
)
from shared.logs import configure_logging, log_uncaught, redact, register_secrets_of
from shared.settings import ServiceSettings, load_settings
from shared.verify.repair import RepairReport
from shared.verify.run import TableReport

log = logging.getLogger(__name__)

S = TypeVar("S", bound=ServiceSettings)


def tune_gc_for_records() -> None:
    """Set the cyclic garbage collector up for a loop that allocates a few containers per
    record, most of them freed by reference counting within a batch:

    * what start-up allocated (modules, clients, settings) is frozen out of its sight, so
      a full collection no longer traverses it again;
    * it runs after 10,000 net allocations instead of 700, so the objects a batch holds
      for a moment are not promoted and re-scanned in the older generations.

    Measured in kafka2search (1M events): time in collections went from 1.2 s to 0.3 s.
    The cost is up to 10,000 unreachable cycles lingering a little longer; the loop
    creates next to none. Called before the loop; only the first call in a process
    freezes (a process that starts services again and again, like the tests, would
    otherwise never free what it let go of between them)."""
    global _gc_tuned
    if _gc_tuned:
        return
    _gc_tuned = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


_gc_tuned = False


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", type=Path, help="YAML settings file")
    parser.add_argument("--env-file", type=Path, help="dotenv file (the local stack writes one)")
    return parser


def add_replay_range(parser: argparse.ArgumentParser) -> None:
    """A replay's start (``--from-offset`` or ``--from-timestamp``) and ``--partition``."""
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--from-offset", type=int, help="offset to start at, in every partition")
    start.add_argument(
        "--from-timestamp",
        type=datetime.fromisoformat,
        help="ISO-8601 time (with offset, e.g. 2026-11-22T10:00:00+00:00)",
    )
    parser.add_argument("--partition", type=int, action="append", help="only these partitions")


def run_command(
    prog: str,
    settings_cls: type[S],
    args: argparse.Namespace,
    command: Callable[[S], int | None],
) -> int:
    """Load settings for ``args`` and run ``command`` with them; return the exit code."""
    try:
        settings = load_settings(settings_cls, config_file=args.config, env_file=args.env_file)
    except WalcastError as exc:
        print(f"{prog}: {redact(str(exc))}", file=sys.stderr)
        return 2
    register_secrets_of(settings)
    configure_logging(settings.log.level, settings.log.format)
    log_uncaught()
    log = logging.getLogger(prog)
    try:
        return command(settings) or 0
    except Exception as exc:
        if classify(exc) is not Verdict.PERMANENT and not isinstance(exc, RetriesExhaustedError):
            raise
        hint = operator_hint(exc)
        if not hint and not isinstance(exc, WalcastError):
            # Not an error walcast knows (a KeyError's text is just the key): say what it
            # is, keep its traceback, and what to do.
            message = (
                f"unexpected {type(exc).__name__}: {exc!r:.300} — a defect in {prog}; report"
                " it with this log. Nothing unconfirmed was lost: a restart resumes from the"
                " last confirmed position"
            )
            log.error("stopping: %s", message, exc_info=exc)
            print(f"{prog}: {redact(message)}", file=sys.stderr)
            return 1
        message = str(exc) if not hint or hint in str(exc) else f"{exc} — {hint}"
        log.error("stopping: %s", message)
        print(f"{prog}: {redact(message)}", file=sys.stderr)
        return 1


def stop_on_signals(stop: Callable[[], None], what: str) -> None:
    """SIGTERM / SIGINT call ``stop`` (the service finishes what it must — ``what`` says
    what, in the log — and returns from ``run``) instead of killing the process."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping %s", signum, what)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def split_table(text: str) -> tuple[str, str]:
    """``schema.table`` as a pair (the first dot separates: a schema name has none);
    ConfigError without one."""
    schema, dot, table = text.partition(".")
    if not dot or not schema or not table:
        raise ConfigError(f"--table {text!r}: expected SCHEMA.TABLE")
    return schema, table


def add_verify_commands(sub: Any, holds: str, every: str) -> None:
    """The ``verify`` and ``repair`` commands of a sink (``holds``: what it keeps per table,
    "indices" / "mirrors"; ``every``: what no ``--table`` means)."""
    for name, helps in (
        ("verify", f"compare {holds} with their Postgres tables (exit 1 when one differs)"),
        ("repair", f"verify, then have pg2kafka read again the key ranges where {holds} differ"
                   " and check them again (exit 1 when one still differs)"),
    ):  # fmt: skip
        p = sub.add_parser(name, help=helps)
        p.add_argument(
            "--table", action="append", default=[], metavar="SCHEMA.TABLE",
            help=f"a table to {name} (repeatable); none: {every}",
        )  # fmt: skip
        p.add_argument("--json", action="store_true", help="one JSON report on standard output")
        p.add_argument(
            "--values", action="store_true",
            help="also check that every row's values are those the service wrote (sees an"
                 " edit made inside the sink; reads every row of the sink): verify.values",
        )  # fmt: skip


SettingsT = TypeVar("SettingsT", bound=BaseModel)


def with_values(settings: SettingsT, values: bool) -> SettingsT:
    """``settings`` with ``verify.values`` on when ``--values`` was given."""
    if not values:
        return settings
    verify = settings.verify.model_copy(update={"values": True})  # type: ignore[attr-defined]
    return settings.model_copy(update={"verify": verify})


def print_verify(reports: list[TableReport], as_json: bool) -> int:
    """A verification's reports: one line per table (or one JSON document); the exit
    code — 1 when a table differs from its source or could not be verified, else 0."""
    if as_json:
        print(json.dumps({"ok": all(r.ok for r in reports),
                          "tables": [r.as_dict() for r in reports]}, indent=2))  # fmt: skip
    else:
        for r in reports:
            d = r.as_dict()
            if r.refused:
                print(f"{d['table']}: NOT VERIFIED — {r.refused}")
                continue
            found = ", ".join(
                f"{kind} {d[kind]['count']} (e.g. {d[kind]['sample']})"
                for kind in ("missing", "extra", "differs", "unknown")
                if d[kind]["count"]
            )
            changing = f"; {d['changing']['count']} rows changing" if d["changing"]["count"] else ""
            print(
                f"{d['table']}: {'equal' if r.ok else 'DIFFERS: ' + found} — {d['rows']} rows in"
                f" {d['ranges']} ranges ({d['ranges_looked_into']} looked into), {d['elapsed_s']}s,"
                f" {d['rows_per_s']} rows/s{changing}"
            )
        if not reports:
            print("no table to verify")
    return 0 if all(r.ok for r in reports) else 1


def say(message: str) -> None:
    """A long command's progress, on standard error (standard output keeps its report)."""
    print(message, file=sys.stderr, flush=True)


def print_repair(reports: list[RepairReport], as_json: bool) -> int:
    """A repair's reports: what verify found per table, what was read again and repaired,
    what still differs (or one JSON document); exit code 1 when a table still differs."""
    if as_json:
        print(json.dumps({"ok": all(r.ok for r in reports),
                          "tables": [r.as_dict() for r in reports]}, indent=2))  # fmt: skip
    else:
        for r in reports:
            d = r.as_dict()
            fixed = ", ".join(
                f"{kind} {v['count']}" for kind, v in d["repaired"].items() if v["count"]
            )
            if r.found.refused:
                state = f"NOT VERIFIED — {r.found.refused}"
            elif r.after is None:
                state = "equal, nothing to repair" if r.ok else "DIFFERS, nothing to read again"
            elif r.ok:
                state = f"repaired ({fixed or 'nothing left different'})"
            else:
                after = r.after.as_dict()
                left = ", ".join(
                    f"{kind} {after[kind]['count']} (e.g. {after[kind]['sample']})"
                    for kind in ("missing", "extra", "differs")
                    if after[kind]["count"]
                )
                state = f"STILL DIFFERS: {left}" + (f"; repaired {fixed}" if fixed else "")
            print(
                f"{d['table']}: {state} — {d['ranges_read_again']} key range(s) read again in"
                f" {d['attempts']} attempt(s), {d['elapsed_s']}s"
            )
        if not reports:
            print("no table to repair")
    return 0 if all(r.ok for r in reports) else 1


def print_last_verified(outcomes: list[dict[str, Any]]) -> None:
    """``status``'s lines for the continuous mode's last verification of each table."""
    for o in outcomes:
        at = datetime.fromtimestamp(float(o.get("at", 0))).isoformat(timespec="seconds")
        if o.get("ok") is None:
            print(f"  verify {o['table']}: did not finish at {at}: {o.get('error')}")
            continue
        state = "equal" if o["ok"] else "DIFFERS"
        print(f"  verify {o['table']}: {state} at {at} ({o.get('rows')} rows)")
