"""Telling a different source from the one a stream carried (services/pg2kafka/source.py):
the decision, and the record's round trip."""

from __future__ import annotations

import pytest

from services.pg2kafka.replication import Identity
from services.pg2kafka.source import SourceRecord, check_lsn_range, decide, judge, record_key
from shared.errors import PermanentError

RECORD = SourceRecord(epoch=2, system="7300000000000000001", timeline=1, lsn=0x3_0000_0000)


def test_the_same_server_further_on_is_the_same_source() -> None:
    assert judge(RECORD, Identity(RECORD.system, 1, 0x3_0000_0000)) is None
    assert judge(RECORD, Identity(RECORD.system, 1, 0x9_0000_0000)) is None


def test_a_stream_without_a_record_has_nothing_to_compare() -> None:
    assert judge(None, Identity("1", 1, 0)) is None


@pytest.mark.parametrize(
    ("now", "said"),
    [
        pytest.param(
            Identity("7300000000000000002", 1, 0x9_0000_0000),
            "another cluster",
            id="system-identifier",
        ),
        pytest.param(Identity(RECORD.system, 2, 0x9_0000_0000), "promoted standby", id="timeline"),
        pytest.param(
            Identity(RECORD.system, 1, 0x2_FFFF_FFFF),
            "restored from a backup",
            id="wal-behind-the-stream",
        ),
    ],
)
def test_a_different_source_is_told_with_the_reason(now: Identity, said: str) -> None:
    reason = judge(RECORD, now)
    assert reason is not None
    assert said in reason


def test_a_server_beyond_what_a_version_holds_is_refused() -> None:
    check_lsn_range(Identity("1", 1, 2**48 - 1))
    with pytest.raises(PermanentError, match="beyond 2\\^48"):
        check_lsn_range(Identity("1", 1, 2**48))


def test_the_record_survives_its_round_trip() -> None:
    assert SourceRecord.from_json(RECORD.to_json()) == RECORD


# -- one record per pipeline; epochs ordered per destination ------------------------------

SYS_A, SYS_B = "7300000000000000001", "7300000000000000002"


def key(system: str, slot: str = "s") -> bytes:
    return record_key("walcast.cdc", "db", slot, system)


def test_a_restart_on_an_unchanged_server_never_drops_to_a_lower_epoch() -> None:
    """Two clusters left writing one topic name (or every Debezium deployment on the
    default producer.topic, before): each keeps its own record; the one whose epoch is
    not the destination's newest starts the next epoch instead of streaming under a
    lower one, whose every change sinks would refuse as stale."""
    records = {
        key(SYS_A): SourceRecord(5, SYS_A, 1, 0x100, "s"),
        key(SYS_B): SourceRecord(3, SYS_B, 1, 0x100, "s"),
    }
    record, reason = decide(records, key(SYS_A), Identity(SYS_A, 1, 0x200), "s", "walcast.cdc")
    assert (record.epoch, reason) == (5, None)
    record, reason = decide(records, key(SYS_B), Identity(SYS_B, 1, 0x200), "s", "walcast.cdc")
    assert record.epoch == 6
    assert reason is not None
    assert "another source" in reason


def test_a_new_database_or_slot_on_the_same_server_joins_the_epoch() -> None:
    records = {key(SYS_A, "a"): SourceRecord(2, SYS_A, 1, 0x100, "a")}
    record, reason = decide(records, key(SYS_A, "b"), Identity(SYS_A, 1, 0x200), "b", "x")
    assert (record.epoch, record.lsn, reason) == (2, 0, None)


def test_a_restored_cluster_starts_the_next_epoch_with_the_reason() -> None:
    records = {key(SYS_A): SourceRecord(2, SYS_A, 1, 0x100, "s")}
    record, reason = decide(records, key(SYS_B), Identity(SYS_B, 1, 0x200), "s", "x")
    assert record.epoch == 3
    assert reason is not None
    assert "another cluster" in reason


def test_a_copy_behind_any_pipeline_of_its_server_is_a_change_of_source() -> None:
    """Restored from a backup: behind slot a's record, though not behind slot b's."""
    records = {
        key(SYS_A, "a"): SourceRecord(1, SYS_A, 1, 0x900, "a"),
        key(SYS_A, "b"): SourceRecord(1, SYS_A, 1, 0x100, "b"),
    }
    record, reason = decide(records, key(SYS_A, "b"), Identity(SYS_A, 1, 0x500), "b", "x")
    assert record.epoch == 2
    assert reason is not None
    assert "restored from a backup" in reason


def test_a_stream_with_no_record_starts_at_epoch_zero() -> None:
    record, reason = decide({}, key(SYS_A), Identity(SYS_A, 1, 0x200), "s", "x")
    assert (record.epoch, reason) == (0, None)


def test_record_keys_tell_pipelines_and_destinations_apart() -> None:
    assert len({key(SYS_A), key(SYS_B), key(SYS_A, "b"), record_key("t", "db", "s", SYS_A)}) == 4
    assert not record_key("t", "db", "s", SYS_A).startswith(b"t")  # never a bare topic name


def test_a_changed_source_asks_for_snapshots_even_when_its_epoch_is_adopted() -> None:
    """Two pipelines on one destination; the server fails over to timeline 2 and A begins
    epoch 1 there. B, restarted next, adopts epoch 1 — and still says why its own source
    changed, so that its tables are snapshotted again (rows of its lost tail removed)."""
    records = {
        key(SYS_A, "a"): SourceRecord(1, SYS_A, 2, 0, "a"),
        key(SYS_A, "b"): SourceRecord(0, SYS_A, 1, 0x5000, "b"),
    }
    record, reason = decide(records, key(SYS_A, "b"), Identity(SYS_A, 2, 0x6000), "b", "x")
    assert record.epoch == 1
    assert record.timeline == 2
    assert reason is not None
    assert "promoted standby" in reason
