"""The local stack's Postgres: installed from Debian's packages, logical replication on,
reachable on loopback and the owner's socket only."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path

from stack_components.base import (
    HOST,
    PG_DATABASE,
    PG_IDENT_MAP,
    PG_PASSWORD,
    PG_PORT,
    PG_USER,
    SOCKET_MODE,
    Component,
    StackError,
    ensure_traversable,
    pid_alive,
    run,
    say,
)

BUFFERS_NOTE = "# walcast stack: an eighth of the memory, 128 MB to 2 GB; ALTER SYSTEM overrides"
_BUFFERS_LINE = re.compile(
    rf"^shared_buffers = (?:128MB|\d+MB  {re.escape(BUFFERS_NOTE)})$", re.MULTILINE
)  # the line this stack writes (128MB: an older stack's)


LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
"""A container's memory limit: cgroup v2's file, then v1's."""


def buffers_line(meminfo: Path = Path("/proc/meminfo"), limits: tuple[Path, ...] = LIMITS) -> str:
    """The server's ``shared_buffers``: an eighth of the machine's memory (in a container,
    of its limit when lower), from 128 MB (Postgres' default) to 2 GB. At 128 MB a target
    of a few million rows no longer fits, and every change reads its pages in and writes
    them back (docs/benchmarks.md: TPC-B into a 10M-row target ran 40% faster at 2 GB);
    the rest of the stack shares the machine, hence an eighth rather than the quarter
    Postgres' docs suggest for a server of its own."""
    total = 0
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit in limits:
        try:
            capped = limit.read_text().strip()  # v2: "max" when there is none
        except OSError:
            continue
        if capped.isdigit():  # v1 without a limit: a number beyond any memory
            total = min(total, int(capped)) if total else int(capped)
        break
    mb = min(max(total // 8 // 2**20, 128), 2048)
    return f"shared_buffers = {mb}MB  {BUFFERS_NOTE}"


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
            ensure_traversable(self.dir)
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
                f"{buffers_line()}\n"
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
        self.size_buffers()
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

    def size_buffers(self) -> None:
        """Rewrite the stack's own ``shared_buffers`` line (an older stack's 128 MB
        included) to :func:`buffers_line` before a start; a value set another way is left
        as it is."""
        conf = self.data / "postgresql.conf"
        text = conf.read_text()
        line = buffers_line()
        sized = _BUFFERS_LINE.sub(lambda _: line, text)
        if sized != text:
            conf.write_text(sized)

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
        target = target_database(PG_DATABASE)
        if (
            self.psql(
                f"SELECT 1 FROM pg_database WHERE datname = '{target}'", step="find target database"
            ).stdout.strip()
            != "1"
        ):
            self.psql(f'CREATE DATABASE "{target}" OWNER walcast', step="create target database")

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
        # kafka2postgres's target: a second database on the same server
        "KAFKA2POSTGRES_TARGET__POSTGRES__HOST": host,
        "KAFKA2POSTGRES_TARGET__POSTGRES__PORT": str(port),
        "KAFKA2POSTGRES_TARGET__POSTGRES__USER": user,
        "KAFKA2POSTGRES_TARGET__POSTGRES__PASSWORD": password,
        "KAFKA2POSTGRES_TARGET__POSTGRES__DATABASE": target_database(database),
    }


def target_database(database: str) -> str:
    """The stack's target database for kafka2postgres, beside the source database."""
    return f"{database}_target"


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
