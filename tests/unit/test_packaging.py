"""What a service image installs: the files its Dockerfile copies, built into a wheel,
must carry the code, the SQL migrations and the event schema, and nothing Spark; the
service's extra (plus the base dependencies) must cover every library its code imports."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
# Every service with an image; each has services/<name>/Dockerfile and an extra <name>.
SERVICES = ["pg2kafka", "kafka2search", "kafka2spark", "kafka2webhook", "kafka2postgres"]
LOCAL_PACKAGES = {"services", "shared", "sql"}


def _copied_paths(dockerfile: Path) -> list[str]:
    paths = []
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"^COPY (?!--from)(.+) (\S+)$", line)
        if m:
            paths.extend(m.group(1).split())
    return paths


def _project() -> dict[str, object]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert isinstance(project, dict)
    return project


def _extras() -> dict[str, list[str]]:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    return extras


def test_every_dockerfile_is_covered() -> None:
    assert {p.parent.name for p in (REPO / "services").glob("*/Dockerfile")} == set(SERVICES)


@pytest.mark.parametrize("service", SERVICES)
def test_image_wheel_carries_code_sql_and_schema(service: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in _copied_paths(REPO / "services" / service / "Dockerfile"):
        origin = REPO / rel
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(  # what .dockerignore keeps out of the build context
                origin, target, ignore=shutil.ignore_patterns("__pycache__", "target", "*.so")
            )
        else:
            shutil.copy(origin, target)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("walcast-*.whl")
    zf = zipfile.ZipFile(wheel)
    names = set(zf.namelist())
    code = sorted(
        p.relative_to(REPO).as_posix() for p in (REPO / "services" / service).glob("*.py")
    )
    assert code
    assert set(code) <= names
    assert "services/__init__.py" in names
    assert "shared/schemas/change_event.v1.json" in names
    migrations = sorted(n for n in names if n.startswith(f"sql/{service}/V"))
    on_disk = sorted(f"sql/{service}/{p.name}" for p in (REPO / "sql" / service).glob("V*.sql"))
    assert migrations == on_disk
    # pg2kafka's and kafka2postgres's compiled paths are built into their wheels (cargo,
    # in the image's build stage); the other images do without.
    native = [n for n in names if "/_native" in n and ".so" in n]
    compiled = {"pg2kafka", "kafka2postgres"}
    assert [n.split("/")[1] for n in native] == ([service] if service in compiled else []), native
    # Only this service: the image does not carry the others' code.
    others = [n for n in names if n.startswith("services/") and n.count("/") > 1]
    assert all(n.startswith(f"services/{service}/") for n in others), others
    # The console script the image's CMD runs is in the wheel's entry points.
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert f"{service} = services.{service}.__main__:main" in zf.read(entry_points).decode()


@pytest.mark.parametrize("service", [s for s in SERVICES if s != "kafka2spark"])
def test_extra_does_not_pull_in_spark(service: str) -> None:
    assert not [d for d in _extras()[service] if "spark" in d.lower()]


def _imported_top_levels(files: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - LOCAL_PACKAGES - {"__future__"}


@pytest.mark.parametrize("service", SERVICES)
def test_extra_covers_what_the_service_imports(service: str) -> None:
    """The image installs ``.[<service>]``: base dependencies plus the extra must provide
    every third-party module the service and the shared package import (lazy imports
    inside functions included, e.g. the search-engine clients)."""
    base = _project()["dependencies"]
    assert isinstance(base, list)
    declared = {canonicalize_name(Requirement(r).name) for r in [*base, *_extras()[service]]}
    files = sorted((REPO / "services" / service).rglob("*.py"))
    files += sorted((REPO / "shared").rglob("*.py"))
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_top_levels(files)):
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        assert dists, f"{module} is imported but no installed distribution provides it"
        if not dists & declared:
            missing[module] = sorted(dists)
    assert not missing, f"{service}: add to the [{service}] extra: {missing}"


def test_kafka2search_elasticsearch_client_matches_the_server() -> None:
    """Elasticsearch 8.x is the supported server (docs/decisions.md): the client is 8.x
    (a 9.x client sends compatible-with=9, which an 8.x server refuses)."""
    (req,) = [
        Requirement(r)
        for r in _extras()["kafka2search"]
        if canonicalize_name(Requirement(r).name) == "elasticsearch"
    ]
    assert "8.19.3" in req.specifier
    assert "7.13.4" not in req.specifier
    assert "9.0.0" not in req.specifier
