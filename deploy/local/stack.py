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
import base64
import contextlib
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MAVEN_DIR = Path(__file__).resolve().parent / "maven"
STATE = Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack")).resolve()
ENV_FILE = STATE / "walcast.env"

HOST = "127.0.0.1"
PG_PORT = int(os.environ.get("WALCAST_STACK_PG_PORT", "55432"))
KAFKA_PORT = int(os.environ.get("WALCAST_STACK_KAFKA_PORT", "29092"))
KAFKA_CONTROLLER_PORT = KAFKA_PORT + 1
# The codelibs OpenSearch runner only serves HTTP on ports 9201-9299.
OPENSEARCH_PORT = int(os.environ.get("WALCAST_STACK_OPENSEARCH_PORT", "9260"))
ELASTICSEARCH_PORT = int(os.environ.get("WALCAST_STACK_ELASTICSEARCH_PORT", "9270"))
DEBEZIUM_PORT = int(os.environ.get("WALCAST_STACK_DEBEZIUM_PORT", "18083"))

# The unix socket: the server's OS user only (the stack's psql runs as that user).
SOCKET_MODE = 0o700
PG_IDENT_MAP = "walcast_owner"
PG_USER = "walcast"
PG_PASSWORD = "walcast"  # local development only; documented in docs/local-stack.md  # noqa: S105
PG_DATABASE = "walcast"

START_TIMEOUT_S = float(os.environ.get("WALCAST_STACK_START_TIMEOUT", "180"))


class StackError(Exception):
    """A component failed at a step; the message tells where to look."""

    def __init__(self, component: str, step: str, detail: str, log: Path | None = None) -> None:
        where = f"; see {log}" if log else ""
        super().__init__(f"{component}: {step} failed: {detail}{where}")


def say(msg: str) -> None:
    print(f"[stack] {msg}", flush=True)


def run(
    cmd: list[str],
    component: str,
    step: str,
    log: Path | None = None,
    *,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise a StackError naming component, step and log."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        raise StackError(component, step, f"{cmd[0]} not found", log) from exc
    except subprocess.TimeoutExpired as exc:
        raise StackError(component, step, f"timed out after {timeout:.0f}s", log) from exc
    if log is not None:
        with log.open("a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if check and proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise StackError(component, step, f"exit {proc.returncode}: {' | '.join(tail)}", log)
    return proc


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (killed, not yet reaped by its parent) is not alive.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait_until(
    what: str,
    probe: Callable[[], bool],
    timeout: float,
    component: str,
    log: Path | None,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll ``probe`` until it is true; fail early when the process has died."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while time.monotonic() < deadline:
        if probe():
            return
        if alive is not None and not alive():
            raise StackError(component, what, "process exited during start-up", log)
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    raise StackError(component, what, f"no answer within {timeout:.0f}s", log)


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def http_json(url: str, timeout: float = 3.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URL
        return json.loads(resp.read())


def java_bin() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin/java").exists():
        return str(Path(home) / "bin/java")
    found = shutil.which("java")
    if not found:
        raise StackError("java", "locate java", "no java on PATH; install OpenJDK 17")
    return found


def maven_digest(name: str) -> str:
    """The digest of a component's pom and the Maven settings, which ``maven_classpath``
    stamps its resolved classpath with (``STATE/<name>/classpath.stamp``)."""
    return file_digest(MAVEN_DIR / name / "pom.xml", MAVEN_DIR / "settings.xml")


def maven_classpath(name: str) -> list[str]:
    """Resolve a component's jars from Maven Central into ~/.m2 (cached, offline after)."""
    comp_dir = STATE / name
    comp_dir.mkdir(parents=True, exist_ok=True)
    pom = MAVEN_DIR / name / "pom.xml"
    settings = MAVEN_DIR / "settings.xml"
    stamp = comp_dir / "classpath.stamp"
    cp_file = comp_dir / "classpath.txt"
    digest = maven_digest(name)
    if cp_file.exists() and stamp.exists() and stamp.read_text() == digest:
        jars = cp_file.read_text().strip().split(os.pathsep)
        if all(Path(j).exists() for j in jars):
            return jars
    mvn = shutil.which("mvn")
    if not mvn:
        raise StackError(
            name, "resolve jars", "mvn not found; install Maven (apt-get install maven)"
        )
    say(f"{name}: resolving jars from Maven Central (first run only)")
    log = comp_dir / "maven.log"
    run(
        [
            mvn,
            "-B",
            "-q",
            "-s",
            str(settings),
            "-f",
            str(pom),
            "dependency:build-classpath",
            f"-Dmdep.outputFile={cp_file}",
            "-Dmdep.includeScope=runtime",
        ],
        name,
        "resolve jars (mvn)",
        log,
        timeout=1800,
    )
    stamp.write_text(digest)
    return cp_file.read_text().strip().split(os.pathsep)


@dataclass
class Health:
    name: str
    state: str  # running | stopped | unhealthy | ready | missing
    port: int | None = None
    pid: int | None = None
    detail: str = ""
    log: str = ""

    @property
    def ok(self) -> bool:
        return self.state in ("running", "ready")


@dataclass
class Component:
    name: str
    port: int | None = None
    dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir = STATE / self.name

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "pid"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid_alive(pid) else None

    # Subclasses implement these.
    def install(self) -> None: ...
    def start(self) -> None: ...
    def harden(self) -> list[str]:
        """Bring an existing installation's security settings up to what a new one gets;
        return what was fixed. Idempotent; runs on every ``up``, healthy or not."""
        return []

    def probe(self) -> tuple[bool, str]:
        return False, ""

    def health(self) -> Health:
        pid = self.pid()
        if pid is None:
            return Health(self.name, "stopped", self.port, None, "not running", str(self.log))
        ok, detail = self.probe()
        return Health(
            self.name, "running" if ok else "unhealthy", self.port, pid, detail, str(self.log)
        )

    def up(self) -> bool:
        """Make the component healthy; return True when something had to change."""
        if self.health().ok:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        self.install()
        if self.pid() is not None:
            # Running but not answering: give it the start-up window before declaring failure.
            self.wait_healthy()
            return False
        self.start()
        self.wait_healthy()
        return True

    def wait_healthy(self) -> None:
        wait_until(
            "wait for health",
            lambda: self.probe()[0],
            START_TIMEOUT_S,
            self.name,
            self.log,
            alive=lambda: self.pid() is not None,
        )

    def stop(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        terminate(pid, self.name)
        self.pid_file.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        return {}


def terminate(pid: int, name: str, grace: float = 60.0) -> None:
    say(f"{name}: stopping pid {pid}")
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.2)
    if pid_alive(pid):
        say(f"{name}: did not stop within {grace:.0f}s, killing")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def spawn(
    cmd: list[str],
    comp: Component,
    *,
    user: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    inherit_env: bool = True,
) -> int:
    """Start a long-running process in its own session, output appended to its log;
    ``user``: as that OS user (its own group, no other groups); ``env`` added to the
    stack's environment, or alone (``inherit_env=False``)."""
    comp.dir.mkdir(parents=True, exist_ok=True)
    as_user: dict[str, Any] = {}
    if user is not None:
        entry = pwd.getpwnam(user)
        as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    with comp.log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd or comp.dir,
            start_new_session=True,
            env=({**os.environ, **env} if inherit_env else env) if env else None,
            **as_user,
        )
    comp.pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


# --------------------------------------------------------------------------- Postgres


class Postgres(Component):
    """PostgreSQL from Debian packages with its own data directory and wal_level=logical."""

    def __init__(self) -> None:
        super().__init__("postgres", PG_PORT)
        self.data = self.dir / "data"
        self.run_dir = self.dir / "run"

    def bindir(self) -> Path | None:
        versions = sorted(
            Path("/usr/lib/postgresql").glob("*/bin/postgres"),
            key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
        )
        return versions[-1].parent if versions else None

    def as_owner(self, cmd: list[str]) -> list[str]:
        # pg_ctl refuses to run as root: run server-side commands as the postgres user.
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *cmd]
        return cmd

    def install(self) -> None:
        if self.bindir() is None:
            say("postgres: installing from Debian packages")
            sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
            # Do not let the package create and start its own cluster on 5432.
            conf = Path("/etc/postgresql-common/createcluster.conf")
            if os.geteuid() == 0 and not conf.exists():
                conf.parent.mkdir(parents=True, exist_ok=True)
                conf.write_text("create_main_cluster = false\n")
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            log = self.dir / "install.log"
            self.dir.mkdir(parents=True, exist_ok=True)
            run([*sudo, "apt-get", "update", "-q"], self.name, "apt-get update", log, env=env)
            run(
                [
                    *sudo,
                    "apt-get",
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    "postgresql",
                    "postgresql-contrib",
                ],
                self.name,
                "apt-get install postgresql",
                log,
                env=env,
            )
            if self.bindir() is None:
                raise StackError(self.name, "install", "postgres binary still missing", log)
        if not (self.data / "PG_VERSION").exists():
            self.initdb()

    def initdb(self) -> None:
        bindir = self.bindir()
        assert bindir is not None
        say("postgres: initdb")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.data.exists():
            shutil.rmtree(self.data)
        self.data.mkdir(parents=True)
        if os.geteuid() == 0:
            for p in (self.dir, self.data, self.run_dir):
                shutil.chown(p, "postgres", "postgres")
            self.log.touch()
            shutil.chown(self.log, "postgres", "postgres")
            _ensure_traversable(self.dir)
        pwfile = self.dir / "pwfile"
        pwfile.write_text(PG_PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        run(
            self.as_owner(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth-local=peer",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                ]
            ),
            self.name,
            "initdb",
            self.log,
        )
        pwfile.unlink()
        conf = self.data / "postgresql.conf"
        with conf.open("a") as fh:
            fh.write(
                "\n# walcast local stack\n"
                f"listen_addresses = '{HOST}'\n"
                f"port = {PG_PORT}\n"
                f"unix_socket_directories = '{self.run_dir}'\n"
                "wal_level = logical\n"
                "max_replication_slots = 64\n"
                "max_wal_senders = 64\n"
                "max_connections = 200\n"
                "shared_buffers = 128MB\n"
                "wal_sender_timeout = 60s\n"
                "logging_collector = off\n"
                f"unix_socket_permissions = {SOCKET_MODE:04o}\n"
            )
        self.write_auth_files()

    def owner(self) -> str:
        """The OS user the server runs as, the only one the socket lets in."""
        return "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def write_auth_files(self) -> list[str]:
        """pg_hba.conf and pg_ident.conf as :func:`pg_hba` / :func:`pg_ident` say; return
        the names of the files that changed (rewritten in place: owner and mode stay)."""
        changed = []
        for name, text in (("pg_hba.conf", pg_hba()), ("pg_ident.conf", pg_ident(self.owner()))):
            path = self.data / name
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                changed.append(name)
        return changed

    def harden(self) -> list[str]:
        """A cluster made by an older stack: its socket accepted anyone as any role
        (``trust``, mode 0777). Rewrite pg_hba.conf / pg_ident.conf, add
        ``unix_socket_permissions``, and when the server runs, reload it (SIGHUP: no
        restart) and give its socket the mode the setting gives it at the next start."""
        if not (self.data / "PG_VERSION").exists():
            return []
        fixed = self.write_auth_files()
        conf = self.data / "postgresql.conf"
        setting = re.compile(r"^\s*unix_socket_permissions\s*=", re.MULTILINE)
        if not setting.search(conf.read_text()):
            with conf.open("a") as fh:
                fh.write(f"unix_socket_permissions = {SOCKET_MODE:04o}\n")
            fixed.append("unix_socket_permissions")
        socket = self.run_dir / f".s.PGSQL.{PG_PORT}"
        if socket.exists() and socket.stat().st_mode & 0o777 != SOCKET_MODE:
            socket.chmod(SOCKET_MODE)
            fixed.append("socket mode")
        bindir = self.bindir()
        if fixed and bindir is not None and self.pid() is not None:
            run(
                self.as_owner([str(bindir / "pg_ctl"), "-D", str(self.data), "reload"]),
                self.name,
                "pg_ctl reload",
                self.log,
            )
        return [f"postgres {what}" for what in fixed]

    def start(self) -> None:
        bindir = self.bindir()
        assert bindir is not None
        say(f"postgres: starting on {HOST}:{PG_PORT}")
        self.clear_stale_lock()
        run(
            self.as_owner(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-w",
                    "-t",
                    "120",
                    "start",
                ]
            ),
            self.name,
            "pg_ctl start",
            self.log,
        )
        self.bootstrap_roles()

    def clear_stale_lock(self) -> None:
        """After a kill -9 the postmaster may linger as a zombie until reaped, and postgres
        refuses to start while the pid in postmaster.pid exists. Wait for it to go; if it
        stays a zombie (no reaping parent), the lock is stale and safe to remove: postgres
        still checks its shared memory for orphaned backends itself."""
        lock = self.data / "postmaster.pid"
        try:
            old = int(lock.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        if pid_alive(old):
            return
        deadline = time.monotonic() + 15
        while Path(f"/proc/{old}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if Path(f"/proc/{old}").exists():
            say(f"postgres: removing stale lock of dead postmaster {old}")
            lock.unlink(missing_ok=True)

    def psql(
        self, sql: str, *, db: str = "postgres", check: bool = True, step: str = "psql"
    ) -> subprocess.CompletedProcess[str]:
        bindir = self.bindir()
        assert bindir is not None
        return run(
            self.as_owner(
                [
                    str(bindir / "psql"),
                    "-h",
                    str(self.run_dir),
                    "-p",
                    str(PG_PORT),
                    "-U",
                    "postgres",
                    "-d",
                    db,
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-qAtc",
                    sql,
                ]
            ),
            self.name,
            step,
            self.log,
            check=check,
            timeout=30,
        )

    def bootstrap_roles(self) -> None:
        """Create the walcast role (login, replication) and database; idempotent."""
        self.psql(
            "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'walcast') THEN "
            f"CREATE ROLE walcast LOGIN SUPERUSER REPLICATION PASSWORD '{PG_PASSWORD}'; "
            "END IF; END$$;",
            step="create role",
        )
        if (
            self.psql(
                f"SELECT 1 FROM pg_database WHERE datname = '{PG_DATABASE}'", step="find database"
            ).stdout.strip()
            != "1"
        ):
            self.psql(f'CREATE DATABASE "{PG_DATABASE}" OWNER walcast', step="create database")

    def pid(self) -> int | None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid_alive(pid) else None

    def probe(self) -> tuple[bool, str]:
        """Healthy = a TCP replication connection as walcast works; wal_level is logical."""
        bindir = self.bindir()
        if bindir is None:
            return False, "not installed"
        env = {**os.environ, "PGPASSWORD": PG_PASSWORD, "PGCONNECT_TIMEOUT": "3"}
        try:
            proc = subprocess.run(
                [
                    str(bindir / "psql"),
                    f"host={HOST} port={PG_PORT} user={PG_USER} dbname={PG_DATABASE} "
                    "replication=database",
                    "-qAtc",
                    "IDENTIFY_SYSTEM",
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=10,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False, "replication connection timed out"
        if proc.returncode != 0:
            return False, proc.stderr.strip().splitlines()[
                -1
            ] if proc.stderr.strip() else "no answer"
        level = subprocess.run(
            [
                str(bindir / "psql"),
                f"host={HOST} port={PG_PORT} user={PG_USER} dbname={PG_DATABASE}",
                "-qAtc",
                "SHOW wal_level",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=10,
            check=False,
        ).stdout.strip()
        if level != "logical":
            return False, f"wal_level={level or '?'}"
        return True, "replication connection ok, wal_level=logical"

    def stop(self) -> None:
        bindir = self.bindir()
        if bindir is None or self.pid() is None:
            return
        say("postgres: stopping")
        run(
            self.as_owner(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "60",
                    "stop",
                ]
            ),
            self.name,
            "pg_ctl stop",
            self.log,
            check=False,
        )

    def env(self) -> dict[str, str]:
        return postgres_env(HOST, PG_PORT, PG_USER, PG_PASSWORD, PG_DATABASE)


def postgres_env(host: str, port: int, user: str, password: str, database: str) -> dict[str, str]:
    """The env file's Postgres entries (also written for containers: tests/containers.py)."""
    return {
        "WALCAST_PG_HOST": host,
        "WALCAST_PG_PORT": str(port),
        "WALCAST_PG_USER": user,
        "WALCAST_PG_PASSWORD": password,
        "WALCAST_PG_DATABASE": database,
        "WALCAST_PG_DSN": f"postgresql://{user}:{password}@{host}:{port}/{database}",
        # pg2kafka's own settings (env prefix PG2KAFKA_), read with --env-file.
        "PG2KAFKA_POSTGRES__HOST": host,
        "PG2KAFKA_POSTGRES__PORT": str(port),
        "PG2KAFKA_POSTGRES__USER": user,
        "PG2KAFKA_POSTGRES__PASSWORD": password,
        "PG2KAFKA_POSTGRES__DATABASE": database,
    }


def pg_hba() -> str:
    """Who may connect how. TCP on loopback only, with a password (SCRAM). The unix socket
    (``unix_socket_permissions`` 0700: only the server's OS user can open it) lets that
    user in as ``postgres`` without a password — how the stack bootstraps roles — and any
    other role only with its password, never ``trust``."""
    return (
        "# walcast local stack (deploy/local/stack.py): loopback and the owner's socket only\n"
        f"local all postgres peer map={PG_IDENT_MAP}\n"
        "local all all scram-sha-256\n"
        "local replication all scram-sha-256\n"
        f"host all all {HOST}/32 scram-sha-256\n"
        f"host replication all {HOST}/32 scram-sha-256\n"
    )


def pg_ident(os_user: str) -> str:
    """The one OS user (the server's owner) that peer authentication maps to ``postgres``."""
    return f"# walcast local stack (deploy/local/stack.py)\n{PG_IDENT_MAP} {os_user} postgres\n"


def _ensure_traversable(path: Path, user: str = "postgres", component: str = "postgres") -> None:
    """A server's OS user (not the stack's) must reach its directory through every parent."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            raise StackError(
                component,
                "check directory permissions",
                f"{parent} is not traversable by the {user} user; "
                "set WALCAST_STACK_DIR to a directory under /tmp or chmod o+x it",
            )


# --------------------------------------------------------------------------- Kafka


class Kafka(Component):
    """Apache Kafka 4.x, one KRaft node acting as broker and controller. ``name`` and
    ``port`` (the controller listens on the next one) let a test start a second, brand-new
    broker beside the stack's, its state in ``home``)."""

    def __init__(
        self, name: str = "kafka", port: int = KAFKA_PORT, home: Path | None = None
    ) -> None:
        super().__init__(name, port)
        if home is not None:
            self.dir = home
        self.bootstrap = f"{HOST}:{port}"
        self.controller = f"{HOST}:{port + 1}"
        self.data = self.dir / "data"
        self.props = self.dir / "server.properties"
        self.log4j = self.dir / "log4j2.properties"
        self.jars: list[str] = []

    def install(self) -> None:
        self.jars = maven_classpath("kafka")
        self.props.write_text(
            "process.roles=broker,controller\n"
            "node.id=1\n"
            f"controller.quorum.voters=1@{self.controller}\n"
            f"listeners=PLAINTEXT://{self.bootstrap},CONTROLLER://{self.controller}\n"
            f"advertised.listeners=PLAINTEXT://{self.bootstrap}\n"
            "controller.listener.names=CONTROLLER\n"
            "inter.broker.listener.name=PLAINTEXT\n"
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
            f"log.dirs={self.data}\n"
            "num.partitions=1\n"
            "offsets.topic.replication.factor=1\n"
            "offsets.topic.num.partitions=10\n"
            "transaction.state.log.replication.factor=1\n"
            "transaction.state.log.min.isr=1\n"
            "share.coordinator.state.topic.replication.factor=1\n"
            "share.coordinator.state.topic.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n"
            # Topics are created on purpose (pg2kafka's auto-create option, the tests):
            # a typo in a topic name must not silently create a new topic.
            "auto.create.topics.enable=false\n"
            "delete.topic.enable=true\n"
            "log.retention.hours=24\n"
            "log.segment.bytes=104857600\n"
            "message.max.bytes=16777216\n"
        )
        self.log4j.write_text(
            "status = warn\n"
            "appender.out.type = Console\n"
            "appender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = info\n"
            "rootLogger.appenderRef.out.ref = OUT\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = warn\n"
            "logger.apache.name = org.apache.kafka\nlogger.apache.level = warn\n"
            "logger.started.name = kafka.server.KafkaRaftServer\nlogger.started.level = info\n"
        )
        if not (self.data / "meta.properties").exists():
            say(f"{self.name}: formatting KRaft storage")
            cluster_id = "-"
            while cluster_id.startswith("-"):  # a leading "-" reads as an option to the tool
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            run(
                [
                    java_bin(),
                    f"-Dlog4j2.configurationFile={self.log4j}",
                    "-cp",
                    os.pathsep.join(self.jars),
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(self.props),
                ],
                self.name,
                "format storage",
                self.log,
            )

    def start(self) -> None:
        say(f"{self.name}: starting on {self.bootstrap}")
        spawn(
            [
                java_bin(),
                "-Xms256m",
                "-Xmx512m",
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true",
                "-Djava.net.preferIPv4Stack=true",
                f"-Dlog4j2.configurationFile={self.log4j}",
                "-cp",
                os.pathsep.join(self.jars),
                "kafka.Kafka",
                str(self.props),
            ],
            self,
        )

    def probe(self) -> tuple[bool, str]:
        """Healthy = the broker creates (if missing) and lists a topic."""
        try:
            from confluent_kafka import KafkaException
            from confluent_kafka.admin import AdminClient, NewTopic
        except ImportError:
            return False, "confluent-kafka missing: run through deploy/local/walcast"
        admin = AdminClient(
            {"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 3000, "log_level": 0}
        )
        topic = "__walcast_stack_health"
        try:
            md = admin.list_topics(timeout=3)
            if topic not in md.topics:
                fut = admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=10)[topic]
                try:
                    fut.result(timeout=10)
                except KafkaException as exc:
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        return False, f"create topic: {exc}"
                md = admin.list_topics(timeout=3)
            if topic not in md.topics:
                return False, "health topic not listed"
            return True, f"{len(md.topics)} topics, broker {next(iter(md.brokers.values()))}"
        except KafkaException as exc:
            return False, str(exc)

    def env(self) -> dict[str, str]:
        return kafka_env(self.bootstrap)


def kafka_env(bootstrap: str) -> dict[str, str]:
    """The env file's Kafka entries: every service's bootstrap servers."""
    return {
        "WALCAST_KAFKA_BOOTSTRAP": bootstrap,
        "PG2KAFKA_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA2SEARCH_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA2SPARK_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA2WEBHOOK_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
    }


# --------------------------------------------------------------------------- search engines


class SearchEngine(Component):
    """One search node, heap capped at 1 GB, treated as ephemeral: each start begins with
    an empty node, so a half-written one from a kill -9 never blocks ``up``."""

    env_key = ""

    def probe(self) -> tuple[bool, str]:
        # _cluster/health and _nodes answer on every distribution (a minimal Elasticsearch
        # 8 answers GET / with 405).
        try:
            body = http_json(f"http://{HOST}:{self.port}/_cluster/health")
            nodes = http_json(
                f"http://{HOST}:{self.port}/_nodes/_local?filter_path=nodes.*.version"
            )["nodes"]
            version = next(iter(nodes.values()))["version"]
        except (OSError, urllib.error.URLError, ValueError, KeyError, StopIteration) as exc:
            return False, f"no answer: {exc}"
        status = body.get("status")
        return status in ("green", "yellow"), f"{self.name} {version}, cluster {status}"

    def env(self) -> dict[str, str]:
        return search_env(self.env_key, f"http://{HOST}:{self.port}")


def search_env(key: str, url: str) -> dict[str, str]:
    """The env file's entry of one search engine (``key``: WALCAST_OPENSEARCH_URL or
    WALCAST_ELASTICSEARCH_URL)."""
    env = {key: url}
    if key == "WALCAST_OPENSEARCH_URL":
        # kafka2search's default engine in the local stack (Elasticsearch: set
        # KAFKA2SEARCH_ENGINE__KIND and __URLS, see docs/kafka2search.md).
        env["KAFKA2SEARCH_ENGINE__URLS"] = f'["{url}"]'
    return env


class OpenSearch(SearchEngine):
    """OpenSearch 2.19 from the codelibs runner jars (Maven Central), which bundle the
    modules (3.x needs Java 21: docs/decisions.md)."""

    env_key = "WALCAST_OPENSEARCH_URL"

    def __init__(self) -> None:
        super().__init__("opensearch", OPENSEARCH_PORT)

    def install(self) -> None:
        self.jars = maven_classpath(self.name)

    def start(self) -> None:
        say(f"{self.name}: starting on {HOST}:{self.port}")
        base = self.dir / "base"
        if base.exists():
            shutil.rmtree(base)
        # The runner keeps a node config it finds. Without one a node scans transport
        # ports 9300-9305 for peers and can join (or refuse) another local cluster:
        # a single-node cluster on its own transport port stays alone.
        config = base / "node_1" / "config"
        config.mkdir(parents=True)
        (config / "opensearch.yml").write_text(
            f"discovery.type: single-node\ntransport.port: {self.port + 100}\n"
        )
        assert self.port is not None
        # The runner numbers nodes from 1 and serves node n on baseHttpPort + n.
        spawn(
            [
                java_bin(),
                "-Xms256m",
                "-Xmx1g",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                "-Djava.net.preferIPv4Stack=true",
                "-Dfile.encoding=UTF-8",
                "-cp",
                os.pathsep.join(self.jars),
                "org.codelibs.opensearch.runner.OpenSearchRunner",
                "-basePath",
                str(base),
                "-numOfNode",
                "1",
                "-baseHttpPort",
                str(self.port - 1),
                "-clusterName",
                f"walcast-{self.name}",
            ],
            self,
        )


def unzip(archive: Path, into: Path) -> None:
    """Unpack a zip keeping each file's Unix mode (the launchers must stay executable),
    refusing members that would land outside ``into``."""
    import zipfile

    into.mkdir(parents=True)
    root = into.resolve()
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            target = (into / info.filename).resolve()
            if root not in target.parents and target != root:
                raise StackError("unzip", "unpack", f"{archive}: {info.filename} leaves the target")
            zf.extract(info, into)
            mode = (info.external_attr >> 16) & 0o777
            if info.is_dir():
                target.chmod(0o755)  # whatever the umask: the server's user reads it
            elif mode:
                target.chmod(mode)


# Elasticsearch refuses to run as root: the stack, when run by root, starts it as this
# system user (created on first use: no login, no home, no password).
ES_OS_USER = "walcast-search"


class Elasticsearch(SearchEngine):
    """Elasticsearch 8.19 from Maven Central's integ-test-zip: the server and the modules
    it needs to run (no painless, reindex or delete-by-query; walcast uses none of them),
    security off, on Java 17 (the stack's). Unpacked once per version under ``dist/``."""

    env_key = "WALCAST_ELASTICSEARCH_URL"

    def __init__(self) -> None:
        super().__init__("elasticsearch", ELASTICSEARCH_PORT)
        self.home: Path | None = None

    def install(self) -> None:
        (archive,) = maven_classpath(self.name)
        home = self.dir / "dist" / Path(archive).name.removesuffix(".zip")
        if not (home / "bin" / "elasticsearch").exists():
            say(f"{self.name}: unpacking {Path(archive).name}")
            unpacked = self.dir / "dist.partial"
            shutil.rmtree(unpacked, ignore_errors=True)
            unzip(Path(archive), unpacked)
            (top,) = list(unpacked.iterdir())
            home.parent.mkdir(parents=True, exist_ok=True)
            home.parent.chmod(0o755)
            shutil.rmtree(home, ignore_errors=True)
            top.rename(home)
            home.chmod(0o755)
            shutil.rmtree(unpacked)
        self.home = home

    def os_user(self) -> str | None:
        """The user the node runs as: the stack's own unless that is root."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(ES_OS_USER)
        except KeyError:
            say(f"{self.name}: creating the system user {ES_OS_USER} (Elasticsearch refuses root)")
            run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                    "--shell",
                    "/usr/sbin/nologin",
                    ES_OS_USER,
                ],
                self.name,
                "create its OS user",
                self.log,
            )
        return ES_OS_USER

    def start(self) -> None:
        assert self.home is not None
        assert self.port is not None
        say(f"{self.name}: starting on {HOST}:{self.port}")
        node = self.dir / "node"
        if node.exists():
            shutil.rmtree(node)
        config = node / "config"
        for sub in ("data", "logs", "tmp", "config"):
            (node / sub).mkdir(parents=True)
        for name in ("jvm.options", "log4j2.properties"):
            shutil.copy(self.home / "config" / name, config / name)
        # Written whole on each start: a node rewrites its config when it sets up security
        # itself, which it must not.
        (config / "elasticsearch.yml").write_text(
            f"cluster.name: walcast-{self.name}\n"
            "node.name: node-1\n"
            f"path.data: {node / 'data'}\n"
            f"path.logs: {node / 'logs'}\n"
            f"network.host: {HOST}\n"
            f"http.port: {self.port}\n"
            f"transport.port: {self.port + 100}\n"
            "discovery.type: single-node\n"
            "xpack.security.enabled: false\n"
            # A full disk is the host's problem, not a reason to make indices read-only.
            "cluster.routing.allocation.disk.threshold_enabled: false\n"
        )
        user = self.os_user()
        if user is not None:
            _ensure_traversable(self.dir, user, self.name)
            entry = pwd.getpwnam(user)
            for path in [node, *node.rglob("*")]:
                os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        java_home = Path(java_bin()).resolve().parent.parent
        spawn(
            [str(self.home / "bin" / "elasticsearch")],
            self,
            user=user,
            cwd=node,
            env={
                # Not the stack's environment: the node's user gets only what it needs.
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "LANG": "C.UTF-8",
                "HOME": str(node),
                "ES_JAVA_HOME": str(java_home),
                "ES_PATH_CONF": str(config),
                "ES_TMPDIR": str(node / "tmp"),
                "ES_JAVA_OPTS": "-Xms256m -Xmx1g",
            },
            inherit_env=False,
        )


# --------------------------------------------------------------------------- Spark


class Spark(Component):
    """PySpark (from PyPI, via the virtualenv) plus the Kafka source and Delta jars.

    Not a server: Spark runs inside the kafka2spark job (local[2] by default). "Healthy"
    means pyspark imports, every jar is in the local Maven cache, and the jars were
    resolved from the current pom and verified with the current pyspark: ``up`` starts one
    local session offline, reads nothing, and loads the Kafka source and the Delta catalog
    classes, once per jar set, pom and pyspark version. A pom or pyspark that changed since
    makes the component unhealthy, so ``up`` resolves and verifies again.
    """

    def __init__(self) -> None:
        super().__init__("spark")
        self.jars_file = self.dir / "jars.txt"
        self.verified = self.dir / "verified.stamp"
        self.classpath_stamp = self.dir / "classpath.stamp"  # written by maven_classpath

    def pyspark_jars_dir(self) -> Path | None:
        try:
            import pyspark
        except ImportError:
            return None
        return Path(pyspark.__file__).parent / "jars"

    def select_jars(self, resolved: list[str]) -> list[str]:
        """Drop jars pyspark already ships (scala-library, hadoop client...) to avoid duplicates."""
        jars_dir = self.pyspark_jars_dir()
        shipped = {p.name for p in jars_dir.glob("*.jar")} if jars_dir else set()
        keep = []
        for jar in resolved:
            path = Path(jar)
            artifact = path.parent.parent.name
            if any(
                name.startswith(artifact + "-") and name[len(artifact) + 1 :][:1].isdigit()
                for name in shipped
            ):
                continue
            keep.append(jar)
        return keep

    def install(self) -> None:
        jars = self.select_jars(maven_classpath("spark"))
        self.jars_file.write_text(",".join(jars))

    def jars(self) -> list[str]:
        try:
            return [j for j in self.jars_file.read_text().strip().split(",") if j]
        except OSError:
            return []

    def health(self) -> Health:
        if self.pyspark_jars_dir() is None:
            return Health(self.name, "missing", None, None, "pyspark not installed", str(self.log))
        jars = self.jars()
        if not jars or not all(Path(j).exists() for j in jars):
            return Health(
                self.name, "missing", None, None, "connector jars not resolved", str(self.log)
            )
        why = self.stale()
        if why:
            return Health(self.name, "unhealthy", None, None, why, str(self.log))
        return Health(
            self.name,
            "ready",
            None,
            None,
            f"pyspark {self.pyspark_version()}, {len(jars)} connector jars",
            str(self.log),
        )

    def pyspark_version(self) -> str:
        import pyspark

        return str(pyspark.__version__)

    def jar_digest(self) -> str:
        return hashlib.sha256(",".join(self.jars()).encode()).hexdigest()[:16]

    def fingerprint(self) -> dict[str, str]:
        """What a verification holds for: the selected jars, the pom they were resolved
        from and the pyspark that selected (``select_jars``) and loaded them."""
        return {
            "jars": self.jar_digest(),
            "pom": maven_digest(self.name),
            "pyspark": self.pyspark_version(),
        }

    def stale(self) -> str:
        """Why the selected jars are not known good for the current pom and pyspark;
        empty when they are."""
        pom = maven_digest(self.name)
        try:
            resolved_from = self.classpath_stamp.read_text().strip()
        except OSError:
            resolved_from = ""
        if resolved_from != pom:
            return "pom.xml changed since the jars were resolved"
        try:
            verified = json.loads(self.verified.read_text())
        except (OSError, ValueError):
            verified = None
        if not isinstance(verified, dict):  # none yet, or a stamp of an older stack
            return "jars not verified yet"
        now = self.fingerprint()
        if verified.get("pyspark") != now["pyspark"]:
            return f"jars verified with pyspark {verified.get('pyspark')}, not {now['pyspark']}"
        if verified.get("pom") != now["pom"]:
            return "pom.xml changed since the jars were verified"
        if verified.get("jars") != now["jars"]:
            return "jars changed since they were verified"
        return ""

    def up(self) -> bool:
        if self.health().ok:
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.pyspark_jars_dir() is None:
            raise StackError(
                self.name, "import pyspark", "pyspark missing: run through deploy/local/walcast"
            )
        self.install()
        say("spark: verifying a local session loads the Kafka source and Delta (first run only)")
        code = (
            "import sys\n"
            "from pyspark.sql import SparkSession\n"
            "s = (SparkSession.builder.master('local[1]').appName('walcast-stack-check')"
            ".config('spark.ui.enabled','false').config('spark.jars', sys.argv[1])"
            ".config('spark.sql.extensions','io.delta.sql.DeltaSparkSessionExtension')"
            ".config('spark.sql.catalog.spark_catalog','org.apache.spark.sql.delta.catalog.DeltaCatalog')"
            ".getOrCreate())\n"
            "jvm = s.sparkContext._jvm\n"
            "for c in ('org.apache.spark.sql.kafka010.KafkaSourceProvider',"
            " 'io.delta.tables.DeltaTable'):\n"
            "    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()\n"
            "    jvm.java.lang.Class.forName(c, True, loader)\n"
            "print('spark', s.version, 'ok')\n"
            "s.stop()\n"
        )
        run(
            [sys.executable, "-c", code, ",".join(self.jars())],
            self.name,
            "start a local session with the connector jars",
            self.log,
            timeout=300,
        )
        self.verified.write_text(json.dumps(self.fingerprint(), sort_keys=True))
        return True

    def stop(self) -> None:
        return

    def env(self) -> dict[str, str]:
        jars = ",".join(self.jars())
        return {
            "WALCAST_SPARK_JARS": jars,
            "KAFKA2SPARK_SPARK__JARS": jars,  # the job starts offline with these
            "KAFKA2SPARK_DELTA__ROOT": str(STATE / "delta"),
        }


# --------------------------------------------------------------------------- Debezium (optional)


class Debezium(Component):
    """Optional (``up debezium``; not in the default ``up``): a Kafka Connect standalone
    worker of the stack's Kafka version with Debezium's PostgreSQL connector on its
    classpath, its REST API on 127.0.0.1. It runs no connector of its own: whoever needs
    one (the tests, the benchmarks) registers it through the REST API with its own slot,
    publication and topic prefix. Offsets live in a file under the state directory."""

    plugin = "io.debezium.connector.postgresql.PostgresConnector"

    def __init__(self) -> None:
        super().__init__("debezium", DEBEZIUM_PORT)
        self.props = self.dir / "worker.properties"
        self.log4j = self.dir / "log4j2.properties"
        self.jars: list[str] = []

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def install(self) -> None:
        self.jars = maven_classpath(self.name)
        self.props.write_text(
            f"bootstrap.servers={HOST}:{KAFKA_PORT}\n"
            "key.converter=org.apache.kafka.connect.json.JsonConverter\n"
            "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
            f"offset.storage.file.filename={self.dir / 'offsets.dat'}\n"
            "offset.flush.interval.ms=1000\n"
            f"listeners={self.url}\n"
            f"rest.advertised.host.name={HOST}\n"
            # The connector is on the classpath, not in a plugin directory.
            "plugin.discovery=only_scan\n"
        )
        self.log4j.write_text(
            "status = warn\n"
            "appender.out.type = Console\n"
            "appender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = warn\n"
            "rootLogger.appenderRef.out.ref = OUT\n"
            "logger.debezium.name = io.debezium\nlogger.debezium.level = info\n"
            "logger.connect.name = org.apache.kafka.connect.runtime.Worker\n"
            "logger.connect.level = info\n"
        )

    def start(self) -> None:
        say(f"{self.name}: starting Kafka Connect (standalone) with Debezium on {self.url}")
        spawn(
            [
                java_bin(),
                "-Xms128m",
                "-Xmx768m",
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                "-Djava.net.preferIPv4Stack=true",
                f"-Dlog4j2.configurationFile={self.log4j}",
                "-cp",
                os.pathsep.join(self.jars),
                "org.apache.kafka.connect.cli.ConnectStandalone",
                str(self.props),
            ],
            self,
        )

    def probe(self) -> tuple[bool, str]:
        """Healthy = the worker's REST API lists Debezium's PostgreSQL connector."""
        try:
            plugins = http_json(f"{self.url}/connector-plugins")
            running = http_json(f"{self.url}/connectors")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            return False, f"no answer: {exc}"
        versions = [p.get("version") for p in plugins if p.get("class") == self.plugin]
        if not versions:
            return False, f"{self.plugin} not among the worker's plugins"
        return True, f"Debezium {versions[0]}, {len(running)} connectors"

    def env(self) -> dict[str, str]:
        return {"WALCAST_DEBEZIUM_URL": self.url}


# --------------------------------------------------------------------------- commands


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
    values: dict[str, str] = {"WALCAST_STACK_DIR": str(STATE)}
    for comp in comps:
        values.update(comp.env())
    return write_env(values, ENV_FILE)


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
    if ENV_FILE.exists() and ENV_FILE.stat().st_mode & 0o777 != ENV_FILE_MODE:
        ENV_FILE.chmod(ENV_FILE_MODE)
        return ["env file mode"]
    return []


def cmd_up(args: argparse.Namespace) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
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
    say(f"connection settings: {ENV_FILE}")
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
                    "env_file": str(ENV_FILE),
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
        print(f"env file: {ENV_FILE}")
    return 0 if all(r.ok for r in rows) else 1


def cmd_logs(args: argparse.Namespace) -> int:
    comp = select([args.component])[0]
    if not comp.log.exists():
        print(f"no log yet at {comp.log}", file=sys.stderr)
        return 1
    tail = ["tail", "-n", str(args.lines)] + (["-F"] if args.follow else []) + [str(comp.log)]
    return subprocess.call(tail)


def cmd_env(_: argparse.Namespace) -> int:
    if not ENV_FILE.exists():
        print("no env file yet: run `up` first", file=sys.stderr)
        return 1
    print(ENV_FILE.read_text(), end="")
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
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
