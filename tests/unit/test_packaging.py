"""What a service image installs: the files its Dockerfile copies, built into a wheel,
must carry the code, the SQL migrations and the event schema, and nothing Spark."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _copied_paths(dockerfile: Path) -> list[str]:
    paths = []
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"^COPY (?!--from)(.+) (\S+)$", line)
        if m:
            paths.extend(m.group(1).split())
    return paths


@pytest.mark.parametrize("service", ["pg2kafka"])
def test_image_wheel_carries_code_sql_and_schema(service: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    for rel in _copied_paths(REPO / "services" / service / "Dockerfile"):
        origin = REPO / rel
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
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
    names = set(zipfile.ZipFile(wheel).namelist())
    assert f"services/{service}/__main__.py" in names
    assert "shared/schemas/change_event.v1.json" in names
    migrations = sorted(n for n in names if n.startswith(f"sql/{service}/V"))
    on_disk = sorted(f"sql/{service}/{p.name}" for p in (REPO / "sql" / service).glob("V*.sql"))
    assert migrations == on_disk


def test_pg2kafka_extra_does_not_pull_in_spark() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert not [d for d in extras["pg2kafka"] if "spark" in d.lower()]
