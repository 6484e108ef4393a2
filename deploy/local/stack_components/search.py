"""The local stack's search engines, OpenSearch and Elasticsearch."""

from __future__ import annotations

import os
import pwd
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from stack_components.base import (
    ELASTICSEARCH_PORT,
    HOST,
    OPENSEARCH_PORT,
    Component,
    StackError,
    ensure_traversable,
    http_json,
    java_bin,
    maven_classpath,
    run,
    say,
    spawn,
)


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
            ensure_traversable(self.dir, user, self.name)
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
