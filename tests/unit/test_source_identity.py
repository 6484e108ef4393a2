"""Telling a different source from the one a stream carried (services/pg2kafka/source.py):
the decision, and the record's round trip."""

from __future__ import annotations

import pytest

from services.pg2kafka.replication import Identity
from services.pg2kafka.source import SourceRecord, check_lsn_range, judge
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
