"""A kill while Spark wrote the query's first offsets leaves a temporary file in the
checkpoint's offsets log; Spark 4 then refused to start the query at every restart
(STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), and the mirror never moved again (found by
``bench/composition.py --seed 1112186381``). The leftover is what such a kill leaves:
Spark writes ``offsets/0`` through a hidden temporary file and renames it. Without the
cleanup the first test fails on the real Spark with STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY
(checked when it was written)."""

from __future__ import annotations

from pathlib import Path

from services.kafka2spark.checkpoint import clear_unstarted
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2spark.conftest import MirrorFactory
from tests.integration.kafka2spark.test_mirror import delta_rows, make_table, pg_rows


def _leave_an_interrupted_first_write(checkpoint: Path) -> list[Path]:
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True)
    tmp = offsets / ".0.6f1c2d0e-3b7a-4c1e-9d55-0a8f7e2b9c41.tmp"
    tmp.write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795737180000,')  # cut
    crc = offsets / "..0.6f1c2d0e-3b7a-4c1e-9d55-0a8f7e2b9c41.tmp.crc"
    crc.write_bytes(b"crc\x00")
    return [tmp, crc]


def test_a_first_batch_killed_while_writing_its_offsets_does_not_stop_the_mirror(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    h = make_harness()
    table = make_table(h)
    h.start()
    h.sql(f"INSERT INTO {table} (id, name) SELECT g, 'n' || g FROM generate_series(1, 20) g")
    h.events(lambda seen: len(h.table_events(table)) >= 20)
    m = make_mirror(h.settings.producer.topic)
    leftovers = _leave_an_interrupted_first_write(m.settings.delta.checkpoint_path())
    m.run()
    assert not any(p.exists() for p in leftovers)
    assert delta_rows(m.path(table)) == pg_rows(h, table)


def test_a_checkpoint_with_a_recorded_batch_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n")
    stray = tmp_path / "offsets" / ".1.abc.tmp"
    stray.write_text("v1\n")
    assert clear_unstarted(tmp_path) == []
    assert stray.exists()
