"""Rows another writer changed in a Delta mirror, found from the table's log
(services/kafka2spark/provenance.py), on real Delta tables written with delta-rs: the
commits tagged as kafka2spark's are the service's, any other is another writer's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from services.kafka2spark.names import HASH, LSN, WRITER, XID
from services.kafka2spark.provenance import Provenance

OURS = CommitProperties(custom_metadata={"userMetadata": WRITER})


def key_of(row: dict[str, Any]) -> tuple[object, ...] | None:
    return None if row["id"] is None else (row["id"],)


def rows(ids: list[int], v: str = "x", lsn: int = 100) -> pa.Table:
    """Rows as a mirror holds them: the values, and kafka2spark's own columns."""
    return pa.table({
        "id": pa.array(ids, pa.int64()), "v": [f"{v}{i}" for i in ids],
        LSN: pa.array([lsn] * len(ids), pa.int64()),
        HASH: pa.array([7] * len(ids), pa.int64()), XID: pa.array([9] * len(ids), pa.int64()),
    })  # fmt: skip


def edited(p: Provenance, path: Path) -> set[tuple[object, ...]]:
    return set(p.edited(path, ["id"], key_of))


def test_a_row_updated_by_another_writer_is_edited_and_the_rows_it_copied_are_not(
    tmp_path: Path,
) -> None:
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    p = Provenance()
    assert edited(p, tmp_path) == set()
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    assert edited(p, tmp_path) == {(2,)}
    (commit,) = p.foreign_commits(tmp_path, key_of)
    assert (commit.version, commit.operation) == (1, "UPDATE")


def test_a_row_walcast_wrote_again_after_the_edit_is_not_edited(tmp_path: Path) -> None:
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    p = Provenance()
    assert edited(p, tmp_path) == {(2,)}
    (
        DeltaTable(tmp_path)
        .merge(rows([2], "again", lsn=200), "s.id = t.id", "s", "t", commit_properties=OURS)
        .when_matched_update_all()
        .execute()
    )
    assert edited(p, tmp_path) == set()  # the new commits read, the old ones remembered


def test_a_delete_by_another_writer_edits_no_row(tmp_path: Path) -> None:
    """The deleted row is missing: the count and hash sums see it; nothing is edited."""
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).delete("id = 2")
    assert edited(Provenance(), tmp_path) == set()


def test_a_row_inserted_by_another_writer_is_edited(tmp_path: Path) -> None:
    write_deltalake(tmp_path, rows([1, 2]), commit_properties=OURS)
    write_deltalake(tmp_path, rows([9]), mode="append")
    assert edited(Provenance(), tmp_path) == {(9,)}


def test_commits_before_the_first_tagged_one_are_not_judged(tmp_path: Path) -> None:
    """A mirror written by a kafka2spark that did not tag its commits yet."""
    write_deltalake(tmp_path, rows([1, 2]))
    DeltaTable(tmp_path).update(updates={"v": "'old'"}, predicate="id = 1")
    write_deltalake(tmp_path, rows([3]), mode="append", commit_properties=OURS)
    assert edited(Provenance(), tmp_path) == set()
    DeltaTable(tmp_path).update(updates={"v": "'new'"}, predicate="id = 2")
    assert edited(Provenance(), tmp_path) == {(2,)}


def test_a_rewrite_that_changes_no_data_is_not_judged(tmp_path: Path) -> None:
    write_deltalake(tmp_path, rows([1]), commit_properties=OURS)
    write_deltalake(tmp_path, rows([2]), mode="append", commit_properties=OURS)
    DeltaTable(tmp_path).optimize.compact()  # another writer's, dataChange false
    p = Provenance()
    assert edited(p, tmp_path) == set()
    assert p.foreign_commits(tmp_path, key_of) == []


def test_an_edit_whose_files_were_vacuumed_is_not_judged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The files an edit replaced are gone: its rows cannot be told from those it copied,
    so none is called edited (no false alarm), and a warning names the commit."""
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    dt = DeltaTable(tmp_path)
    dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert edited(Provenance(), tmp_path) == set()
    assert "commit 1 (UPDATE)" in caplog.text


def test_the_continuous_mode_judged_it_before_the_vacuum(tmp_path: Path) -> None:
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    p = Provenance()
    assert edited(p, tmp_path) == {(2,)}
    DeltaTable(tmp_path).vacuum(retention_hours=0, enforce_retention_duration=False,
                                dry_run=False)  # fmt: skip
    assert edited(p, tmp_path) == {(2,)}


def test_a_rewrite_of_the_whole_table_by_kafka2spark_keeps_an_edit(tmp_path: Path) -> None:
    """A column renamed or dropped: kafka2spark writes the table anew, every row copied
    with its own columns as they were."""
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    now = DeltaTable(tmp_path).to_pyarrow_table().rename_columns(["id", "w", LSN, HASH, XID])
    write_deltalake(tmp_path, now, mode="overwrite", schema_mode="overwrite",
                    commit_properties=OURS)  # fmt: skip
    assert edited(Provenance(), tmp_path) == {(2,)}


def test_a_float_nan_copied_along_is_not_an_edit(tmp_path: Path) -> None:
    t = rows([1, 2]).append_column("f", pa.array([float("nan"), 1.0]))
    write_deltalake(tmp_path, t, commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    assert edited(Provenance(), tmp_path) == {(2,)}


def test_a_row_with_a_null_key_is_not_compared(tmp_path: Path) -> None:
    write_deltalake(tmp_path, rows([1]), commit_properties=OURS)
    t = rows([5]).set_column(0, "id", pa.array([None], pa.int64()))
    write_deltalake(tmp_path, t, mode="append")
    assert edited(Provenance(), tmp_path) == set()


def test_an_edit_carried_along_by_later_rewrites_stays_edited(tmp_path: Path) -> None:
    """Another writer's delete rewrites the file around the edited row; then kafka2spark's
    own copy-on-write MERGE of another row rewrites it again: the edit is still there."""
    write_deltalake(tmp_path, rows([1, 2, 3, 4]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    DeltaTable(tmp_path).delete("id = 4")
    assert edited(Provenance(), tmp_path) == {(2,)}
    (
        DeltaTable(tmp_path)
        .merge(rows([3], "new", lsn=200), "s.id = t.id", "s", "t", commit_properties=OURS)
        .when_matched_update_all()
        .execute()
    )
    assert edited(Provenance(), tmp_path) == {(2,)}


def test_an_edit_deleted_by_kafka2spark_is_gone(tmp_path: Path) -> None:
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    DeltaTable(tmp_path).delete("id = 2", commit_properties=OURS)
    assert edited(Provenance(), tmp_path) == set()
