"""A throwaway PostgreSQL cluster beside the stack's own: for a server configured wrongly
on purpose, or one restored from its own base backup (a source whose LSNs go back).

Run as the ``postgres`` user when the tests run as root (initdb refuses root). Listens on
127.0.0.1 and a free port; everything lives in one temporary directory, removed by
:meth:`PgCluster.remove`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.ports import free_port


class PgCluster:
    """``initdb`` with trust authentication for ``postgres``; :meth:`start` with extra
    ``-c`` settings; :meth:`base_backup` / :meth:`restore` to go back in time."""

    def __init__(self) -> None:
        self.bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))[-1].parent
        self.root = Path(tempfile.mkdtemp(prefix="walcast-pgtest-"))
        self.data = self.root / "data"
        self.as_owner: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self.root.chmod(0o755)
            self.as_owner = ["runuser", "-u", "postgres", "--"]
        self.port = free_port()
        self.settings: dict[str, str] = {}
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust")

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def start(self, **settings: str) -> None:
        self.settings = settings or self.settings
        options = " ".join(
            [f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"]
            + [f"-c {k}={v}" for k, v in self.settings.items()]
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-o", options, "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def base_backup(self, name: str = "backup") -> Path:
        """A base backup of the running cluster, with the WAL it needs (replication slots
        are not part of one)."""
        target = self.root / name
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                  "-D", str(target), "-X", "stream", "-c", "fast")  # fmt: skip
        return target

    def restore(self, backup: Path) -> None:
        """The stopped cluster replaced by ``backup``: started, it recovers to the backup's
        end and goes on from there, on the same timeline with the same system identifier."""
        self.stop()
        shutil.rmtree(self.data)
        backup.rename(self.data)

    def log_tail(self, lines: int = 30) -> str:
        log = self.root / "log"
        if not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        proc = subprocess.run([*self.as_owner, str(self.bindir / program), *args],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({proc.returncode}): {proc.stderr.strip()}\n{self.log_tail()}"
            )
