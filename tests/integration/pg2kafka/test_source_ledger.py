"""The source ledger against real Kafka: two pipelines from different clusters writing
one destination (two environments left on the default topic name, or every Debezium
deployment on the default ``producer.topic`` before) never make a restart on an
unchanged server drop to a lower epoch — after which sinks would refuse every change as
stale, silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.pg2kafka.replication import Identity
from services.pg2kafka.source import SourceLedger
from tests.integration.conftest import make_settings

pytestmark = pytest.mark.integration

SYS_A, SYS_B = "7400000000000000001", "7400000000000000002"


def test_a_restart_on_an_unchanged_server_keeps_its_epoch_whatever_another_source_wrote(
    env_file: Path, unique_name: str
) -> None:
    settings = make_settings(env_file, unique_name,
                             producer={"source_topic": f"{unique_name}.sources"})  # fmt: skip

    def start(system: str, timeline: int) -> tuple[SourceLedger, int]:
        ledger = SourceLedger(settings)
        record, reason = ledger.start(Identity(system, timeline, 0x1000))
        if reason is not None:
            ledger.commit(record)  # as the stream does once its snapshots are asked for
        return ledger, record.epoch

    a, epoch = start(SYS_A, 1)
    a.close()
    assert epoch == 0
    b, b_epoch = start(SYS_B, 1)  # another cluster, same topic name: still running
    assert b_epoch == 1
    for timeline in (2, 3):  # A's server promoted twice: a new epoch each time
        a, epoch = start(SYS_A, timeline)
        a.close()
    assert epoch == 3
    b._last_write = 0.0  # its next status interval has come
    b.advance(0x2000)  # B, still at epoch 1, records its progress
    b.close()
    a, again = start(SYS_A, 3)  # A restarts, nothing changed
    a.close()
    assert again == epoch, f"a restart on an unchanged server went from epoch {epoch} to {again}"
    c, c_epoch = start(SYS_B, 1)  # B restarts: it must not stream below A's epoch
    c.close()
    assert c_epoch > epoch
