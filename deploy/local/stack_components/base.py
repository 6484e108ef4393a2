"""What every component of the local stack shares: where it lives (ports, the state
directory), running commands, waiting, Maven classpaths, and the ``Component`` contract
(install, start, health, stop)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
MAVEN_DIR = Path(__file__).resolve().parents[1] / "maven"


def state_dir() -> Path:
    """The state directory: ``.stack/`` at the repository root, or ``$WALCAST_STACK_DIR``
    (read at each call, so a test or a second stack can point elsewhere)."""
    return Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack")).resolve()


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
            raise StackError(component, what, f"process exited during start-up{log_tail(log)}", log)
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    raise StackError(component, what, f"no answer within {timeout:.0f}s", log)


def log_tail(log: Path | None, lines: int = 12) -> str:
    """The last lines of a log, to quote in an error: a CI run keeps only what it printed."""
    if log is None:
        return ""
    try:
        tail = log.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n    | {line}" for line in tail) + "\n   " if tail else ""


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
    stamps its resolved classpath with (``<state dir>/<name>/classpath.stamp``)."""
    return file_digest(MAVEN_DIR / name / "pom.xml", MAVEN_DIR / "settings.xml")


def maven_classpath(name: str) -> list[str]:
    """Resolve a component's jars from Maven Central into ~/.m2 (cached, offline after)."""
    comp_dir = state_dir() / name
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
        self.dir = state_dir() / self.name

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "pid"

    def pid(self) -> int | None:
        """The component's running process, from its pid file: None when that process is
        gone — or when the number now belongs to another process (a pid file outlives its
        process; the number is reused), which is told by the component's state directory
        missing from the command line every process of ours is started with."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not pid_alive(pid):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return pid  # no /proc to ask: trust the pid file
        return pid if str(self.dir).encode() in cmdline else None

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
            alive=self.started_alive,
        )

    def started_alive(self) -> bool:
        """Whether the process in the pid file still runs (a zombie does not). Not
        ``pid()``: ``Popen`` returns once the child's exec closed its file descriptors,
        before the kernel has laid out its new command line, which then reads empty (as
        it does again while a launcher re-executes itself). ``pid()`` takes such a
        process for someone else's, and a CI run once reported an OpenSearch that went on
        to start as "exited during start-up" that way."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return False
        return pid_alive(pid)

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


def ensure_traversable(path: Path, user: str = "postgres", component: str = "postgres") -> None:
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
