"""docs/design.md maps every module of pg2kafka and kafka2spark: a module added without
a line there fails here (the map is how a newcomer finds where a thing lives)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DESIGN = (REPO / "docs" / "design.md").read_text()
NAMED = set(re.findall(r"`([A-Za-z_/]+\.py)`", DESIGN)) | set(re.findall(r"`([a-z_]+/)`", DESIGN))


@pytest.mark.parametrize("service", ["pg2kafka", "kafka2spark"])
def test_the_design_map_names_every_module(service: str) -> None:
    root = REPO / "services" / service
    missing = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__init__.py" or path.name.startswith("_native"):
            continue
        rel = path.relative_to(root)
        names = {path.name, str(rel)}
        if rel.parent != Path("."):
            names.add(f"{rel.parts[0]}/")  # a package row that lists its modules
        if not names & NAMED:
            missing.append(str(rel))
    assert not missing, f"docs/design.md does not map services/{service}: {missing}"
