"""The test suite's other backend: services in containers started by testcontainers,
for machines with a Docker engine, instead of the local stack (deploy/local/stack.py).

Selected explicitly, never by guessing: ``WALCAST_TEST_BACKEND=containers`` (the default
is ``stack``). With it, the session starts PostgreSQL (``wal_level=logical``), Kafka in
KRaft mode, OpenSearch and Elasticsearch as containers, writes the same env file the
local stack writes (the same names, from the stack's own functions) into a directory of
its own, and points ``WALCAST_STACK_DIR`` at it; the tests run unchanged. Spark is not a
server: its jars are resolved by the stack's Spark component as usual.

Tests that exercise the local stack's own machinery — starting and stopping it, Postgres
clusters from the Debian binaries, the Debezium connector it runs — are skipped with that
reason. No Docker engine runs where this project is developed: this path is untested
there (README, "Tests").
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
BACKEND_VAR = "WALCAST_TEST_BACKEND"
Backend = Literal["stack", "containers"]

# Images matching the local stack's versions (deploy/local/maven/*/pom.xml).
IMAGES = {
    "postgres": "postgres:15",
    "kafka": "confluentinc/cp-kafka:7.9.0",
    "opensearch": "opensearchproject/opensearch:2.19.1",
    "elasticsearch": "docker.elastic.co/elasticsearch/elasticsearch:8.19.0",
}
PG_USER = PG_PASSWORD = PG_DATABASE = "walcast"  # throwaway containers

# Test modules that need the local stack itself, with the reason they are skipped.
STACK_ONLY = {
    "test_local_stack.py": "tests the local stack's own start, stop and recovery",
    "test_fresh_broker.py": "restarts the local stack's Kafka on a fresh log directory",
    "test_pg2kafka_server_checks.py": "starts Postgres clusters from the Debian binaries",
    "test_source_change.py": "restores and promotes Postgres clusters from the Debian binaries",
    "test_stack_debezium.py": "runs the local stack's Debezium connector",
    "test_debezium_sinks.py": "runs the local stack's Debezium connector",
    "test_debezium_format.py": "compares with the local stack's Debezium connector",
}


class BackendError(RuntimeError):
    """The selected backend cannot run here; the message says what to do."""


def select_backend(environ: Mapping[str, str]) -> Backend:
    """``stack`` unless ``WALCAST_TEST_BACKEND`` says ``containers``; anything else is an
    error (a typo must not silently test against something else)."""
    value = environ.get(BACKEND_VAR, "stack").strip().lower() or "stack"
    if value not in ("stack", "containers"):
        raise BackendError(f"{BACKEND_VAR}={value!r}: use 'stack' (the default) or 'containers'")
    return "containers" if value == "containers" else "stack"


def skip_reason(backend: Backend, test_file: str) -> str | None:
    """Why a test module does not run under ``backend`` (None: it runs)."""
    if backend == "containers" and Path(test_file).name in STACK_ONLY:
        return f"needs the local stack: {STACK_ONLY[Path(test_file).name]}"
    return None


def docker_engine() -> Any:
    """A client of a Docker engine that answers, or :class:`BackendError` saying so."""
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:
        raise BackendError(
            f"{BACKEND_VAR}=containers needs a running Docker engine ({exc}); unset it to"
            " test against the local stack (deploy/local/walcast test)"
        ) from exc
    return client


def stack_module() -> Any:
    """deploy/local/stack.py, whose functions name the env file's entries."""
    sys.path.insert(0, str(REPO / "deploy" / "local"))
    try:
        return importlib.import_module("stack")
    finally:
        sys.path.pop(0)


def env_values(
    state: Path, pg: tuple[str, int], kafka: str, opensearch: str, elasticsearch: str
) -> dict[str, str]:
    """The env file for containers at these endpoints (the stack's names and shapes)."""
    stack = stack_module()
    values = {"WALCAST_STACK_DIR": str(state)}
    values.update(stack.postgres_env(pg[0], pg[1], PG_USER, PG_PASSWORD, PG_DATABASE))
    values.update(stack.kafka_env(kafka))
    values.update(stack.search_env("WALCAST_OPENSEARCH_URL", opensearch))
    values.update(stack.search_env("WALCAST_ELASTICSEARCH_URL", elasticsearch))
    return values


class Containers:
    """The four servers, started once per test session."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.started: list[Any] = []

    def start(self) -> dict[str, str]:
        docker_engine()
        from testcontainers.community.elasticsearch import ElasticSearchContainer
        from testcontainers.community.kafka import KafkaContainer
        from testcontainers.community.opensearch import OpenSearchContainer
        from testcontainers.community.postgres import PostgresContainer

        pg = PostgresContainer(IMAGES["postgres"], username=PG_USER, password=PG_PASSWORD,
                               dbname=PG_DATABASE, driver=None)  # fmt: skip
        pg.with_command("postgres -c wal_level=logical -c max_replication_slots=64"
                        " -c max_wal_senders=64 -c max_connections=300")  # fmt: skip
        kafka = KafkaContainer(IMAGES["kafka"]).with_kraft()
        opensearch = OpenSearchContainer(IMAGES["opensearch"])
        elasticsearch = ElasticSearchContainer(IMAGES["elasticsearch"], mem_limit="2G")
        for c in (pg, kafka, opensearch, elasticsearch):
            c.start()
            self.started.append(c)

        def url(c: Any) -> str:
            return f"http://{c.get_container_host_ip()}:{c.get_exposed_port(9200)}"

        self.state.mkdir(parents=True, exist_ok=True)
        # Spark's jars as the local stack resolves them (Maven), into this state directory.
        os.environ["WALCAST_STACK_DIR"] = str(self.state)
        stack = stack_module()  # reads WALCAST_STACK_DIR at each use
        spark = stack.Spark()
        spark.install()
        values = env_values(
            self.state,
            (pg.get_container_host_ip(), int(pg.get_exposed_port(5432))),
            kafka.get_bootstrap_server(),
            url(opensearch),
            url(elasticsearch),
        )
        values.update(spark.env())
        stack.write_env(values, self.state / "walcast.env")
        return values

    def stop(self) -> None:
        for c in reversed(self.started):
            c.stop()
        self.started.clear()
