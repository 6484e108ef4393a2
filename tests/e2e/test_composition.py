"""The composition suite's short form (the long form is ``python bench/composition.py
--runs 50``; its figures are in docs/benchmarks.md): three fixed seeds whose scenarios
between them use every load order (keys before / after data, CREATE TABLE AS, dropped and
re-created, TRUNCATE + reload), every partition key, every snapshot trigger (initial,
signal table, CLI, automatic on gaining a key) and kill pg2kafka in the middle of a
snapshot at a failpoint — beside a keyless insert-only table, TOAST values, DDL during
the load, a kill of every service (at failpoints: mid-bulk, mid-micro-batch), a Kafka
restart and a frozen search engine. Each ends with both search engines and the Delta
mirror equal to Postgres row by row (the keyless table as a multiset), compared without
walcast's code.

A failing seed is replayed with ``python bench/composition.py --seed N``.
"""

from __future__ import annotations

import pytest

from bench.composition import LOAD_ORDERS, PARTITION_KEYS, TRIGGERS, Scenario, print_run, run_one

pytestmark = pytest.mark.e2e

SEEDS = (22, 39, 178)
ROWS, LOAD_S = 300, 15.0


def test_the_fixed_seeds_cover_every_load_order_key_and_snapshot_trigger() -> None:
    scenarios = [Scenario.draw(seed, ROWS, LOAD_S, keyless=True) for seed in SEEDS]
    assert {o for s in scenarios for o in s.tables.values()} >= set(LOAD_ORDERS)
    assert {s.partition_key for s in scenarios} == set(PARTITION_KEYS)
    assert {t for s in scenarios for t in s.triggers} == set(TRIGGERS)
    mid_snapshot = [s.kills["pg2kafka"] for s in scenarios if s.kills["pg2kafka"] != "timed"]
    assert any(k.startswith(("incremental.", "snapshot.")) for k in mid_snapshot)
    assert any(s.kafka_restart for s in scenarios)
    assert any(s.engine_stop for s in scenarios)
    # a seed is a scenario: drawn again, the same
    assert Scenario.draw(SEEDS[0], ROWS, LOAD_S, True) == scenarios[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_composition_of_features_and_faults_converges_exactly(
    seed: int, unique_name: str
) -> None:
    report = run_one(seed, ROWS, LOAD_S, keyless=True, timeout_s=240, name=unique_name[:40])
    print_run(report)
    assert report.defects == [], report.defects
    assert report.mismatches == {}, f"replay: python bench/composition.py --seed {seed}"
    assert report.converge_s is not None
    assert report.lsn_order_violations == 0
    assert report.events > 0
    assert report.faults, "no fault was injected"
