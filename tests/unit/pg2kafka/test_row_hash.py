"""pg2kafka's compiled row hasher (services/pg2kafka/native/src/rowhash.rs) gives the
number the contract's reference gives (shared/contract/rowhash.py) for any row: names in
any script, empty and NULL values, an unchanged TOAST value (no hash). That Postgres's SQL
gives it too is tests/integration/pg2kafka/test_row_hash.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.pg2kafka._native import RowHasher
from shared.contract.rowhash import row_hash, text_hash

names = st.lists(st.text(min_size=1, max_size=12).filter(lambda s: "\x00" not in s),
                 min_size=0, max_size=8, unique=True)  # fmt: skip


@given(names.flatmap(lambda ns: st.tuples(
    st.just(ns), st.lists(st.one_of(st.none(), st.text(max_size=40)),
                          min_size=len(ns), max_size=len(ns)))))  # fmt: skip
def test_the_compiled_hasher_agrees_with_the_reference(
    row: tuple[list[str], list[str | None]],
) -> None:
    cols, values = row
    assert RowHasher(cols).hash(tuple(values)) == row_hash(zip(cols, values, strict=True))


def test_a_row_is_the_sum_of_its_non_null_columns_hashes() -> None:
    cols = [("id", "7"), ("b", ""), ("é", "ü"), ("z", None)]
    want = (text_hash(b"2:id7") + text_hash(b"1:b") + text_hash("2:éü".encode())) % 2**32
    assert row_hash(cols) == want
    # A column's place does not matter; a NULL column is as if absent.
    assert row_hash(reversed(cols)) == row_hash(cols[:3])
    assert row_hash([("z", None)]) == 0


def test_text_hash_is_postgres_hashtext() -> None:
    # SELECT hashtext(x)::bigint & 4294967295 (PostgreSQL 15, little-endian); the
    # integration test compares many more with the server itself
    assert text_hash(b"") == 2_817_148_525
    assert text_hash(b"abc") == 3_509_578_647
    assert text_hash(b"0123456789abcdefghijklmnopqrstuvwxyz") == 3_361_583_595


def test_an_unchanged_toast_value_means_no_hash() -> None:
    assert RowHasher(["id", "big"]).hash(("1", object())) is None


def test_a_row_of_another_width_is_refused() -> None:
    with pytest.raises(ValueError, match="2 values for 3 columns"):
        RowHasher(["a", "b", "c"]).hash(("1", "2"))
