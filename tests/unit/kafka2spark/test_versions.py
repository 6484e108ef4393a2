"""pyspark, delta-spark and the jars move together (docs/decisions.md): the versions pinned
in pyproject.toml, resolved by the local stack's pom and fetched by the image's Dockerfile
are the same Spark and Delta; the Delta jar is built for that Spark."""

from __future__ import annotations

import re
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[3]
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _pinned() -> dict[str, str]:
    """The kafka2spark extra's ``==`` pins, by package name."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    out: dict[str, str] = {}
    for line in extras["kafka2spark"]:
        req = Requirement(line)
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            out[canonicalize_name(req.name)] = specs[0].version
    return out


def _pom() -> dict[str, str]:
    root = ET.parse(REPO / "deploy/local/maven/spark/pom.xml").getroot()  # noqa: S314 - ours
    deps = root.findall("m:dependencies/m:dependency", POM_NS)
    return {
        f"{d.findtext('m:groupId', namespaces=POM_NS)}:"
        f"{d.findtext('m:artifactId', namespaces=POM_NS)}": str(
            d.findtext("m:version", namespaces=POM_NS)
        )
        for d in deps
    }


def _image_packages() -> dict[str, str]:
    text = (REPO / "services/kafka2spark/Dockerfile").read_text()
    (value,) = re.findall(r"^ARG SPARK_PACKAGES=(\S+)$", text, re.MULTILINE)
    return {c.rsplit(":", 1)[0]: c.rsplit(":", 1)[1] for c in value.split(",")}


def test_pyspark_delta_and_the_jars_name_the_same_versions() -> None:
    pinned = _pinned()
    spark, delta = pinned["pyspark"], pinned["delta-spark"]
    expected = {
        "org.apache.spark:spark-sql-kafka-0-10_2.13": spark,
        "io.delta:delta-spark_2.13": delta,
    }
    assert _pom() == expected
    assert _image_packages() == expected


def test_the_installed_pyspark_and_delta_are_the_pinned_ones() -> None:
    """The virtualenv the tests run in has what pyproject pins (a stale venv would test
    another Spark than the one the jars are for)."""
    import importlib.metadata

    pinned = _pinned()
    assert importlib.metadata.version("pyspark") == pinned["pyspark"]
    assert importlib.metadata.version("delta-spark") == pinned["delta-spark"]
