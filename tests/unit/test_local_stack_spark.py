"""The local stack's Spark component is "ready" only for the jars resolved from the current
pom and verified with the current pyspark: a changed pom or pyspark makes ``up`` resolve
and verify again (before, the old jars stayed "ready" after a version move)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.stack_module import load_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    state = tmp_path / "state"
    module = load_stack(state, monkeypatch)
    maven = tmp_path / "maven"
    (maven / "spark").mkdir(parents=True)
    (maven / "spark/pom.xml").write_text("<project>spark 4.2.0, delta 4.4.0</project>\n")
    (maven / "settings.xml").write_text("<settings/>\n")
    monkeypatch.setattr(module.base, "MAVEN_DIR", maven)
    return module


@pytest.fixture
def spark(stack: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Spark component whose jars were resolved and verified, without Maven or a JVM:
    the state files are those ``maven_classpath`` and ``up`` write."""
    comp = stack.Spark()
    version = {"pyspark": "4.2.0"}
    monkeypatch.setattr(comp, "pyspark_jars_dir", lambda: tmp_path / "pyspark-jars")
    monkeypatch.setattr(comp, "pyspark_version", lambda: version["pyspark"])
    comp.version = version  # the test moves pyspark through this
    jar = tmp_path / "m2/delta-spark_2.13-4.4.0.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"jar")
    comp.dir.mkdir(parents=True)
    comp.jars_file.write_text(str(jar))
    comp.classpath_stamp.write_text(stack.base.maven_digest("spark"))
    comp.verified.write_text(json.dumps(comp.fingerprint()))
    return comp


def test_ready_when_resolved_from_this_pom_and_verified_with_this_pyspark(spark: Any) -> None:
    health = spark.health()
    assert (health.state, health.detail) == ("ready", "pyspark 4.2.0, 1 connector jars")
    assert spark.stale() == ""


def test_a_changed_pom_makes_it_unhealthy(stack: Any, spark: Any) -> None:
    (stack.base.MAVEN_DIR / "spark/pom.xml").write_text("<project>spark 4.3.0</project>\n")
    health = spark.health()
    assert health.state == "unhealthy"
    assert not health.ok  # so `up` resolves and verifies again
    assert health.detail == "pom.xml changed since the jars were resolved"
    # Re-resolved (maven_classpath stamps the new digest) but not verified yet.
    spark.classpath_stamp.write_text(stack.base.maven_digest("spark"))
    assert spark.health().detail == "pom.xml changed since the jars were verified"


def test_a_changed_pyspark_makes_it_unhealthy(spark: Any) -> None:
    spark.version["pyspark"] = "4.2.1"
    health = spark.health()
    assert (health.state, health.detail) == (
        "unhealthy",
        "jars verified with pyspark 4.2.0, not 4.2.1",
    )


def test_a_changed_jar_set_or_an_old_stamp_makes_it_unhealthy(spark: Any, tmp_path: Path) -> None:
    other = tmp_path / "m2/other.jar"
    other.write_bytes(b"jar")
    spark.jars_file.write_text(f"{spark.jars()[0]},{other}")
    assert spark.health().detail == "jars changed since they were verified"
    # The stamp of a stack before this check held only the jar digest: verify again.
    spark.verified.write_text(spark.jar_digest())
    assert spark.health().detail == "jars not verified yet"
    spark.verified.unlink()
    assert spark.health().detail == "jars not verified yet"
