"""Compiled or interpreted plans per micro-batch (``spark.interpret_below``): a batch is
read interpreted, then runs interpreted below the bound and compiled from it on, in both
the stream's session and the job's; keys the user set in ``spark.conf`` are left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.kafka2spark.mirror import DeltaMirror
from services.kafka2spark.settings import Kafka2SparkSettings
from shared.settings import load_settings

WHOLE_STAGE, FACTORY = "spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode"


class FakeConf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class FakeSession:
    def __init__(self) -> None:
        self.conf = FakeConf()


def mirror(tmp_path: Path, **spark: Any) -> tuple[DeltaMirror, FakeSession]:
    job = FakeSession()
    s = load_settings(Kafka2SparkSettings, delta={"root": str(tmp_path)}, spark=spark)
    return DeltaMirror(job, s), job  # type: ignore[arg-type]


def test_small_batches_are_interpreted_and_large_ones_compiled(tmp_path: Path) -> None:
    m, job = mirror(tmp_path, interpret_below=1000)
    stream = FakeSession()
    m._plans_for(999, stream)  # type: ignore[arg-type]
    for session in (job, stream):
        assert session.conf.values == {WHOLE_STAGE: "false", FACTORY: "NO_CODEGEN"}
    m._plans_for(1000, stream)  # type: ignore[arg-type]
    for session in (job, stream):
        assert session.conf.values == {WHOLE_STAGE: "true", FACTORY: "FALLBACK"}


def test_zero_always_compiles_and_the_users_keys_win(tmp_path: Path) -> None:
    m, job = mirror(tmp_path, interpret_below=0)
    m._plans_for(5, job)  # type: ignore[arg-type]
    assert job.conf.values == {}
    m, job = mirror(tmp_path, conf={WHOLE_STAGE: "false"})
    m._plans_for(5, job)  # type: ignore[arg-type]
    assert job.conf.values == {FACTORY: "NO_CODEGEN"}  # wholeStage is the user's
