"""The Delta side's range summaries for a single integer key (services/kafka2spark/verify.py):
the sort-free pass over a whole table's ranges and the sorted path for any other ranges
agree with a plain count and sum per range, unknown hashes and keys on the bounds
included; a read ahead (while the marker is awaited) serves the summaries only while the
mirror has no newer commit."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from services.kafka2spark.names import HASH, XID
from services.kafka2spark.verify import DeltaTarget, _integer_summaries
from shared.verify.core import KeyRange, Summary

T = ("s", "t")


def plain(keys: list[int], hashes: list[int | None], ranges: list[KeyRange]) -> list[Summary]:
    out = []
    for r in ranges:
        inside = [
            h for k, h in zip(keys, hashes, strict=True)
            if (r.lower is None or k > r.lower[0]) and (r.upper is None or k <= r.upper[0])  # type: ignore[operator]
        ]  # fmt: skip
        known = [h for h in inside if h is not None]
        out.append(Summary(len(inside), sum(known), len(inside) - len(known)))
    return out


def table(seed: int, n: int) -> tuple[list[int], list[int | None]]:
    rnd = random.Random(seed)
    keys = rnd.sample(range(-1000, 5000), n)
    hashes: list[int | None] = [None if rnd.random() < 0.05 else rnd.randrange(2**32) for _ in keys]
    return keys, hashes


def arrays(keys: list[int], hashes: list[int | None]) -> tuple[np.ndarray, ...]:
    k = np.array(keys, dtype=np.int64)
    h = np.array([x or 0 for x in hashes], dtype=np.int64)
    known = np.array([x is not None for x in hashes])
    return k, h, known


@pytest.mark.parametrize("seed", range(5))
def test_a_whole_tables_ranges_in_one_pass(seed: int) -> None:
    keys, hashes = table(seed, 800)
    cuts = sorted(random.Random(seed).sample(keys, 9))  # bounds on keys the table holds
    bounds: list[tuple[object, ...] | None] = [None, *[(c,) for c in cuts], None]
    ranges = [KeyRange(a, b) for a, b in itertools.pairwise(bounds)]
    assert _integer_summaries(*arrays(keys, hashes), ranges) == plain(keys, hashes, ranges)


def test_ranges_that_are_not_a_whole_table_take_the_sorted_path() -> None:
    keys, hashes = table(9, 500)
    ranges = [KeyRange((10,), (200,)), KeyRange((-5,), (3,)), KeyRange(None, (-900,))]
    assert _integer_summaries(*arrays(keys, hashes), ranges) == plain(keys, hashes, ranges)


def test_one_range_for_the_whole_table() -> None:
    keys, hashes = table(3, 50)
    ranges = [KeyRange(None, None)]
    assert _integer_summaries(*arrays(keys, hashes), ranges) == plain(keys, hashes, ranges)


def test_sums_stay_exact_for_a_range_of_the_most_rows() -> None:
    n = 1 << 21  # verify.range_rows at most: hashes just under 2^32 each
    k = np.arange(n, dtype=np.int64)
    h = np.full(n, 2**32 - 1, dtype=np.int64)
    (s,) = _integer_summaries(k, h, np.ones(n, dtype=bool), [KeyRange(None, None)])
    assert s == Summary(n, n * (2**32 - 1), 0)


# -- read ahead while the marker is awaited --------------------------------------------


def _target(path: Path) -> DeltaTarget:
    t = DeltaTarget.__new__(DeltaTarget)  # the Delta side alone: no Kafka group
    t.key_shape = lambda table: (("id",), ("int8",))
    t.path = lambda table: path  # type: ignore[method-assign]
    t._ahead = {}
    return t


def _write(path: Path, ids: list[int], mode: str = "append") -> None:
    write_deltalake(
        str(path), pa.table({"id": ids, HASH: [7] * len(ids), XID: [1] * len(ids)}), mode=mode
    )


def test_a_read_ahead_is_used_only_while_the_mirror_has_not_moved(tmp_path: Path) -> None:
    _write(tmp_path, list(range(10)))
    whole = [KeyRange(None, None)]
    t = _target(tmp_path)
    t.prefetch(T)
    read_again = t._read
    t._read = lambda *a, **k: pytest.fail("read again though nothing was committed")  # type: ignore[method-assign]
    assert t._summaries(T, whole) == [Summary(10, 70)]

    t._read = read_again  # type: ignore[method-assign]
    t.prefetch(T)
    _write(tmp_path, [10, 11])  # a commit after the read ahead: the state it read is gone
    assert t._summaries(T, whole) == [Summary(12, 84)]


def test_no_mirror_yet_is_no_read_ahead(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()  # made before its first commit
    t = _target(tmp_path)
    t.prefetch(T)
    assert t._ahead == {}
