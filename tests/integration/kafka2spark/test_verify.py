"""``kafka2spark verify`` against the real services (pg2kafka streaming, kafka2spark's
streaming query into Delta, the mirror read with deltalake): a mirror equal to its table
is verified from range summaries alone; differences made behind walcast's back are each
reported with their key — a Delta row deleted (missing), a row updated in Postgres while
the slot was moved past the update (differs), a value changed in the mirror by another
writer (differs, edited in the sink: the mirror's log says who wrote it)."""

from __future__ import annotations

import threading

from deltalake import DeltaTable

from services.kafka2spark.verify import verify
from services.pg2kafka import admin
from tests.integration.conftest import HarnessFactory, keyed_source
from tests.integration.kafka2spark.conftest import Mirror, MirrorFactory, verify_settings, wait_for

ROWS = 400


class Streaming:
    """The mirror's query run again and again (each run takes what the topic holds), on
    a thread, until stopped or paused."""

    def __init__(self, m: Mirror) -> None:
        self.m = m
        self.go = threading.Event()
        self.idle = threading.Event()
        self.stopped = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stopped.is_set():
            if not self.go.wait(0.2):
                self.idle.set()
                continue
            self.idle.clear()
            try:
                self.m.run(timeout=180)
            except BaseException as exc:  # noqa: BLE001 - surfaced by the test
                self.errors.append(exc)
                return

    def start(self) -> Streaming:
        self.go.set()
        self.thread.start()
        return self

    def pause(self) -> None:
        self.go.clear()
        wait_for(self.idle.is_set, "the mirror's query to finish its run", 240)

    def stop(self) -> None:
        self.stopped.set()
        self.go.set()
        self.thread.join(240)


def test_kafka2spark_verify_finds_each_difference_by_key(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, unique_name: str
) -> None:
    schema = f"sv_{unique_name}"
    h = keyed_source(make_harness, schema)
    q = f'"{schema}"'
    h.sql(f"CREATE TABLE {q}.t (id int PRIMARY KEY, v text, n int)")
    h.sql(f"INSERT INTO {q}.t SELECT g, 'v' || g, g FROM generate_series(1, {ROWS}) g")
    admin.init(h.settings)
    h.start()
    m = make_mirror(h.settings.producer.topic)
    path = m.path("t", schema)
    streaming = Streaming(m).start()
    try:
        wait_for(
            lambda: (
                any((path / "_delta_log").glob("*.json"))  # its first commit made
                and DeltaTable(str(path)).to_pyarrow_table(columns=["id"]).num_rows == ROWS
            ),
            "the mirror caught up",
            300,
        )
        settings = verify_settings(m, h.settings, range_rows=100)
        (equal,) = verify(settings, [(schema, "t")])
        assert equal.ok, equal.as_dict()
        assert (equal.rows, equal.looked_into) == (ROWS, 0)

        streaming.pause()
        DeltaTable(str(path)).delete("id = 7")  # behind walcast's back
        # another writer's UPDATE: the row keeps walcast's hash, in a range equal by its sums
        DeltaTable(str(path)).update(predicate="id = 250", updates={"v": "'edited'"})
        h.stop()
        h.sql(f"UPDATE {q}.t SET v = 'bypassed' WHERE id = 9")
        h.sql(
            "SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())",
            [h.settings.replication.slot],
        )
        h.start()
        streaming.go.set()
        (report,) = verify(settings, [(schema, "t")])
        d = report.as_dict()
        assert not report.ok
        assert d["missing"] == {"count": 1, "sample": [7]}, d
        assert d["differs"] == {"count": 2, "sample": [9, 250]}, d
        assert d["edited_in_sink"] == {"count": 1, "sample": [250]}, d
        assert (d["extra"]["count"], d["unknown"]["count"]) == (0, 0), d
    finally:
        streaming.stop()
    assert not streaming.errors, streaming.errors
