"""walcast local stack: real Postgres, Kafka, OpenSearch, Elasticsearch and Spark, no Docker.

Run through the ``deploy/local/walcast`` wrapper, which first makes sure the project's
virtualenv exists. Everything binds to 127.0.0.1 and lives under one git-ignored state
directory (``.stack/`` at the repository root, or ``$WALCAST_STACK_DIR``).

Contract of each command:

* ``up``     installs what is missing, starts what is not running, waits until every
             component really answers, then writes the env file. Idempotent: on a healthy
             stack it changes nothing (same pids, same env file).
             The env file holds passwords: it is created 0600. Postgres's unix socket is
             0700 and only the server's OS user gets in without a password (as
             ``postgres``, to bootstrap roles); nothing is ``trust``. ``up`` brings an
             installation made before these rules up to them (a reload, no restart).
* ``down``   stops every component cleanly (Postgres data and Kafka logs are kept;
             the search engines are ephemeral and start empty).
* ``status`` one line per component: state, port, pid, health detail, log file.
             Exit code 1 when anything is not healthy.
* ``logs``   tails a component's log.

A failure names the component, the step and the log file to read.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# The parts live beside this file; run as a script or loaded by path, it finds them.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from stack_components import base
from stack_components.base import (
    Component,
    StackError,
    say,
    state_dir,
)
from stack_components.debezium import Debezium
from stack_components.kafka import Kafka, kafka_env
from stack_components.postgres import Postgres, pg_hba, pg_ident, postgres_env
from stack_components.search import Elasticsearch, OpenSearch, SearchEngine, search_env
from stack_components.spark import Spark

__all__ = [
    "Debezium",
    "Elasticsearch",
    "Kafka",
    "OpenSearch",
    "Postgres",
    "SearchEngine",
    "Spark",
    "base",
    "kafka_env",
    "pg_hba",
    "pg_ident",
    "postgres_env",
    "search_env",
]


def env_file() -> Path:
    """The env file ``up`` writes: the services', tests' and demo's connection settings."""
    return state_dir() / "walcast.env"


def components() -> list[Component]:
    """What ``up`` starts when no component is named."""
    return [Postgres(), Kafka(), OpenSearch(), Elasticsearch(), Spark()]


def optional_components() -> list[Component]:
    """Started only when named (``up debezium``); ``down`` and ``status`` without names
    include them while they run."""
    return [Debezium()]


def select(names: list[str] | None) -> list[Component]:
    if not names:
        return components() + [c for c in optional_components() if c.pid() is not None]
    comps = components() + optional_components()
    known = {c.name for c in comps}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"unknown component(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return [c for c in comps if c.name in names]


ENV_FILE_MODE = 0o600


def write_env_file(comps: list[Component]) -> bool:
    """Write the env file; return True when its content changed."""
    values: dict[str, str] = {"WALCAST_STACK_DIR": str(state_dir())}
    for comp in comps:
        values.update(comp.env())
    return write_env(values, env_file())


def write_env(values: dict[str, str], path: Path) -> bool:
    """Write ``values`` as an env file at ``path``; return True when its content changed.

    It holds passwords, so it is never readable by others: a new file is created with
    mode 0600 (a temporary file made with that mode, then renamed over the old one — no
    moment where the content sits in a wider file). An existing file's mode is fixed by
    :func:`fix_env_file_mode`."""
    text = (
        "# written by deploy/local/stack.py up; read by the services, tests and demo\n"
        + "".join(f"{k}={v}\n" for k, v in sorted(values.items()))
    )
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ENV_FILE_MODE)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def fix_env_file_mode() -> list[str]:
    """An env file written by an older stack may be readable by everyone: make it 0600."""
    if env_file().exists() and env_file().stat().st_mode & 0o777 != ENV_FILE_MODE:
        env_file().chmod(ENV_FILE_MODE)
        return ["env file mode"]
    return []


def cmd_up(args: argparse.Namespace) -> int:
    state_dir().mkdir(parents=True, exist_ok=True)
    comps = select(args.components)
    changed = []
    fixed = fix_env_file_mode()
    for comp in comps:
        t0 = time.monotonic()
        try:
            fixed += comp.harden()
            if comp.up():
                changed.append(comp.name)
                say(f"{comp.name}: ready in {time.monotonic() - t0:.1f}s")
        except StackError as exc:
            print(f"[stack] FAILED {exc}", file=sys.stderr, flush=True)
            return 1
    if write_env_file(components() + optional_components()):
        changed.append("env file")
    if fixed:
        say("secured: " + ", ".join(fixed))
    if changed:
        say("started: " + ", ".join(changed))
    elif not fixed:
        say("already up; nothing changed")
    say(f"connection settings: {env_file()}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    for comp in reversed(select(args.components)):
        comp.stop()
    say("down")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    rows = [c.health() for c in select(args.components)]
    if args.json:
        print(
            json.dumps(
                {
                    "env_file": str(env_file()),
                    "components": [r.__dict__ | {"ok": r.ok} for r in rows],
                },
                indent=2,
            )
        )
    else:
        print(f"{'component':<14}{'state':<11}{'port':<7}{'pid':<9}detail")
        for r in rows:
            print(f"{r.name:<14}{r.state:<11}{r.port or '-'!s:<7}{r.pid or '-'!s:<9}{r.detail}")
            if not r.ok:
                print(f"{'':<14}log: {r.log}")
        print(f"env file: {env_file()}")
    return 0 if all(r.ok for r in rows) else 1


def cmd_logs(args: argparse.Namespace) -> int:
    comp = select([args.component])[0]
    if not comp.log.exists():
        print(f"no log yet at {comp.log}", file=sys.stderr)
        return 1
    tail = ["tail", "-n", str(args.lines)] + (["-F"] if args.follow else []) + [str(comp.log)]
    return subprocess.call(tail)


def cmd_env(_: argparse.Namespace) -> int:
    if not env_file().exists():
        print("no env file yet: run `up` first", file=sys.stderr)
        return 1
    print(env_file().read_text(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="walcast-stack", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="install what is missing, start, wait until healthy")
    p.add_argument("components", nargs="*")
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("down", help="stop everything cleanly")
    p.add_argument("components", nargs="*")
    p.set_defaults(func=cmd_down)
    p = sub.add_parser("status", help="component, state, port, pid, health")
    p.add_argument("components", nargs="*")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("logs", help="tail a component's log")
    p.add_argument("component")
    p.add_argument("-n", "--lines", type=int, default=50)
    p.add_argument("-f", "--follow", action="store_true")
    p.set_defaults(func=cmd_logs)
    p = sub.add_parser("env", help="print the connection settings")
    p.set_defaults(func=cmd_env)
    args = parser.parse_args(argv)
    if args.func in (cmd_up, cmd_down):
        # One `up` or `down` at a time: parallel test workers may each ask for an optional
        # component; the second waits for the first and then finds it running.
        state_dir().mkdir(parents=True, exist_ok=True)
        with open(state_dir() / "stack.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            result: int = args.func(args)
        return result
    result = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
