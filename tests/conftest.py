"""Session fixtures shared by every tier.

Integration and e2e tests read connection settings from the env file the local stack
writes (``deploy/local/walcast up``), or from ``$WALCAST_ENV_FILE``. A missing stack is a
test *failure* with instructions, never a skip: CI must not go green without services.
With ``WALCAST_TEST_BACKEND=containers`` the same tests run against containers that
testcontainers starts instead (tests/containers.py).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.containers import Containers, select_backend, skip_reason

REPO = Path(__file__).resolve().parents[1]

# Tests share one database: a pg2kafka that took the initial snapshot by default would
# read every test's tables. Tests stream what they write; the snapshot tests ask for
# snapshots explicitly (settings or env win over this default). Subprocesses inherit it.
os.environ.setdefault("PG2KAFKA_SNAPSHOT__MODE", "never")
os.environ.setdefault("PG2KAFKA_SNAPSHOT__AUTOMATIC", "false")


def _env_file() -> Path:
    explicit = os.environ.get("WALCAST_ENV_FILE")
    if explicit:
        return Path(explicit)
    state = Path(os.environ.get("WALCAST_STACK_DIR", REPO / ".stack"))
    return state / "walcast.env"


@pytest.fixture(scope="session")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if select_backend(os.environ) == "containers":
        containers = Containers(tmp_path_factory.mktemp("containers-stack"))
        try:
            yield containers.start()
        finally:
            containers.stop()
        return
    yield _stack_env()


def _stack_env() -> dict[str, str]:
    path = _env_file()
    if not path.is_file():
        pytest.fail(
            f"no local stack env file at {path}: start the services with "
            "`deploy/local/walcast up` (or run the suite with `deploy/local/walcast test`)",
            pytrace=False,
        )
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def own_tables(name: str) -> list[str]:
    """Filters (``filters.include``) for the tables of the test that ``name`` (a
    :func:`unique_name`) belongs to: those whose schema or table name holds its random
    suffix. Tests run beside each other on one database; a pg2kafka streaming every table
    would carry its neighbours' changes too."""
    suffix = name[-8:]
    return [f"*.*{suffix}*", f"*{suffix}*.*"]


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A name no other test (or earlier run) uses: for slots, topics, indices, tables."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:30]
    return f"t_{base}_{uuid.uuid4().hex[:8]}"


# Tests that stop, freeze or reconfigure a service every other test uses. `walcast test`
# runs every other test on two workers at once, then these alone (marker ``serial``).
SERIAL = {
    "tests/e2e/test_chaos.py": "restarts Kafka and Postgres, stops a search engine",
    "tests/e2e/test_composition.py": "restarts Kafka, freezes a search engine",
    "tests/e2e/test_kafka2search_faults.py": "stops and freezes a search engine",
    "tests/e2e/test_pg2kafka_faults.py": "stops Kafka",
    "tests/e2e/test_local_stack.py": "stops and starts the stack's components",
    "tests/e2e/test_subscription_failover.py": "stops Kafka, sets max_slot_wal_keep_size",
    "tests/integration/test_commit_deadline.py": "freezes Kafka",
    "tests/integration/pg2kafka/test_keyless_tables.py": "a FOR ALL TABLES publication"
    " refuses every keyless table's updates; init's warnings list the database's keyless"
    " tables",
    "tests/integration/pg2kafka/test_quarantine_metric.py": "checks the DDL capture, which"
    " the tear-down of the database's last stream removes",
    "tests/integration/pg2kafka/test_subscriptions_sql.py": "makes and drops the daily"
    " partitions every stream's maintenance also touches",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier from its directory, so `-m unit` etc. select them, and
    with ``serial`` when it disrupts the shared stack; under the containers backend, skip
    what needs the local stack itself."""
    backend = select_backend(os.environ)
    for item in items:
        if Path(str(item.fspath)).resolve().relative_to(REPO).as_posix() in SERIAL:
            item.add_marker(pytest.mark.serial)
        reason = skip_reason(backend, str(item.fspath))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        parts = Path(str(item.fspath)).parts
        for tier in ("unit", "integration", "e2e"):
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
    items[:] = long_ones_first(items)


# The files whose tests run longest (`--durations` of the last full runs, seconds on the
# 2-core machine), longest first. See long_ones_first.
LONG = [
    "tests/e2e/test_kafka2spark_verify.py",  # ~300
    "tests/integration/test_snapshot_sinks.py",  # ~260
    "tests/integration/kafka2spark/test_verify_time_keys.py",  # ~140-230
    "tests/e2e/test_debezium_sinks.py",  # ~190
    "tests/integration/kafka2spark/test_mirror.py",  # ~180
    "tests/e2e/test_kafka2spark_crash.py",  # ~210
    "tests/e2e/test_pgbench_reload.py",  # ~150
    "tests/integration/kafka2search/test_verify_time_keys.py",  # ~110
    "tests/integration/kafka2webhook/test_webhooks.py",  # ~75
    "tests/integration/test_bad_input_matrix.py",  # ~75
    "tests/e2e/test_kafka2spark_standalone.py",  # ~65
]


def long_ones_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The order the parallel phase runs in: each of its two workers starts with half of
    the :data:`LONG` files (alternately), then the other tests. pytest-xdist's
    ``worksteal`` hands each worker one contiguous half of the list and lets an idle
    worker steal from the *end* of the other's queue, so a long test placed late could
    start last on one worker while the other has nothing left to take. Serial tests
    (deselected in that phase) go last and do not count in the halves; a file's tests stay
    together."""

    def rel(item: pytest.Item) -> str:
        return Path(str(item.fspath)).resolve().relative_to(REPO).as_posix()

    serial = [i for i in items if i.get_closest_marker("serial")]
    parallel = [i for i in items if not i.get_closest_marker("serial")]
    by_file: dict[str, list[pytest.Item]] = {f: [] for f in LONG}
    rest: list[pytest.Item] = []
    for item in parallel:
        by_file.get(rel(item), rest).append(item)
    groups = [g for g in by_file.values() if g]
    first = [i for g in groups[0::2] for i in g]
    second = [i for g in groups[1::2] for i in g]
    fill = max(0, len(parallel) // 2 - len(first))
    return first + rest[:fill] + second + rest[fill:] + serial


@pytest.fixture
def slots_move_often(stack_env: dict[str, str]) -> Iterator[None]:
    """A checkpoint every second while the test runs. A repair's snapshot is taken once
    its slot's restart position is past the request (V021), and that position moves only
    at a record of the running transactions the slot decodes: Postgres 15 writes one every
    15 s, or at a checkpoint (from Postgres 16 ``request_repair`` writes it itself). The
    waits the tests exercise are the same; they only end sooner."""
    stop = threading.Event()

    def tick() -> None:
        with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as conn:
            while not stop.wait(1.0):
                conn.execute("CHECKPOINT")

    ticker = threading.Thread(target=tick, name="checkpoints", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join(30)
