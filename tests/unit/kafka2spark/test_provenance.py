"""Rows another writer changed in a Delta mirror, found from the table's log
(services/kafka2spark/provenance.py), on real Delta tables written with delta-rs: the
commits tagged as kafka2spark's are the service's, any other is another writer's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from services.kafka2spark.names import WRITER
from services.kafka2spark.provenance import Provenance

OURS = CommitProperties(custom_metadata={"userMetadata": WRITER})


def key_of(row: dict[str, Any]) -> tuple[object, ...]:
    return (row["id"],)


def rows(ids: list[int], v: str = "x") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"{v}{i}" for i in ids]})


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
        .merge(rows([2], "again"), "s.id = t.id", "s", "t", commit_properties=OURS)
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


def test_without_the_files_an_edit_removed_every_row_it_wrote_counts(tmp_path: Path) -> None:
    """The files an edit replaced were vacuumed: no old row to compare with."""
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    dt = DeltaTable(tmp_path)
    dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert edited(Provenance(), tmp_path) == {(1,), (2,), (3,)}


def test_an_edit_carried_along_by_later_rewrites_stays_edited(tmp_path: Path) -> None:
    """Another writer's delete rewrites the file around the edited row; then kafka2spark's
    own copy-on-write MERGE of another row rewrites it again: the edit is still there."""
    write_deltalake(tmp_path, rows([1, 2, 3, 4]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    DeltaTable(tmp_path).delete("id = 4")
    assert edited(Provenance(), tmp_path) == {(2,)}
    (
        DeltaTable(tmp_path)
        .merge(rows([3], "new"), "s.id = t.id", "s", "t", commit_properties=OURS)
        .when_matched_update_all()
        .execute()
    )
    assert edited(Provenance(), tmp_path) == {(2,)}


def test_an_edit_deleted_by_kafka2spark_is_gone(tmp_path: Path) -> None:
    write_deltalake(tmp_path, rows([1, 2, 3]), commit_properties=OURS)
    DeltaTable(tmp_path).update(updates={"v": "'edited'"}, predicate="id = 2")
    DeltaTable(tmp_path).delete("id = 2", commit_properties=OURS)
    assert edited(Provenance(), tmp_path) == set()
