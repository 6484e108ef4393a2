"""Session fixtures shared by every tier.

Integration and e2e tests read connection settings from the env file the local stack
writes (``deploy/local/walcast up``), or from ``$WALCAST_ENV_FILE``. A missing stack is a
test *failure* with instructions, never a skip: CI must not go green without services.
With ``WALCAST_TEST_BACKEND=containers`` the same tests run against containers that
testcontainers starts instead (tests/containers.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A name no other test (or earlier run) uses: for slots, topics, indices, tables."""
    base = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:30]
    return f"t_{base}_{uuid.uuid4().hex[:8]}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier from its directory, so `-m unit` etc. select them; under
    the containers backend, skip what needs the local stack itself."""
    backend = select_backend(os.environ)
    for item in items:
        reason = skip_reason(backend, str(item.fspath))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        parts = Path(str(item.fspath)).parts
        for tier in ("unit", "integration", "e2e"):
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
