"""The CDC handler of each output format (services/pg2kafka/cdc.py), chosen once from the
settings: what both formats owe the stream whatever they write — the source's ledger
follows the confirmed position (a restored copy of the database is told from it) — and
the Debezium format's verification markers (on every partition, or none when off)."""

from __future__ import annotations

from typing import Any, cast

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.cdc import CdcHandler, DebeziumCdc, WalcastCdc, cdc_handler
from services.pg2kafka.changes import EventBuilder
from services.pg2kafka.session import HandlerContext
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.source import SourceLedger
from services.pg2kafka.topics import StreamTarget
from services.pg2kafka.types import TypeRegistry
from shared.formats.debezium_input import events
from shared.settings import load_settings


class Ledger:
    """SourceLedger as a handler uses it: the current record, and ``advance``."""

    current = None

    def __init__(self) -> None:
        self.advanced: list[int] = []

    def advance(self, lsn: int) -> None:
        self.advanced.append(lsn)


class Session:
    """HandlerContext's confirmed position, all that housekeeping reads without
    incremental snapshots."""

    confirmed_lsn = 0x16B3748


def handler(fmt: str, ledger: Ledger) -> CdcHandler:
    s = load_settings(
        Pg2KafkaSettings, env_file=None, http={"enabled": False}, producer={"format": fmt}
    )
    return cdc_handler(s, StreamTarget.cdc(s), None, cast(SourceLedger, ledger))


@pytest.mark.parametrize(("fmt", "kind"), [("walcast", WalcastCdc), ("debezium", DebeziumCdc)])
def test_each_format_has_its_handler_and_the_ledger_follows_the_confirmed_position(
    fmt: str, kind: type[CdcHandler]
) -> None:
    ledger = Ledger()
    h = handler(fmt, ledger)
    assert type(h) is kind
    session: Any = Session()
    assert h.housekeeping(cast(HandlerContext, session)) is False
    assert ledger.advanced == [0x16B3748]


class MarkSession:
    """What :meth:`DebeziumCdc.verify_marks` uses of a session: the builder's open
    transaction, the catalog, topics' partitions, and where records go."""

    def __init__(self, partitions: int) -> None:
        self.builder = EventBuilder("db", TypeRegistry())
        self.builder.begin(pg.Begin(0x5000, 1_700_000_000_000_000, 42))
        self.catalog = self
        self.partitions = partitions
        self.written: list[Any] = []
        self.counted: list[tuple[str, int]] = []

    def not_null(self, _oid: int) -> set[str]:
        return set()

    def primary_key(self, _oid: int) -> list[str]:
        return []

    def ensure_topic(self, _topic: str) -> int:
        return self.partitions

    def refresh_partitions(self, _topic: str) -> int:
        return self.partitions

    def write(self, out: Any) -> None:
        self.written.append(out)

    def count(self, op: str, nbytes: int) -> None:
        self.counted.append((op, nbytes))


def mark_message(tables: list[tuple[str, str]]) -> Any:
    content = {"id": "v-9", "tables": [{"schema": s, "table": t} for s, t in tables]}
    return pg.Message(True, 0x4FF0, "walcast.verify", orjson.dumps(content))


def test_the_debezium_format_writes_a_marker_to_every_partition_of_each_table() -> None:
    h = cast(DebeziumCdc, handler("debezium", Ledger()))
    session: Any = MarkSession(partitions=3)
    message = mark_message([("app", "a"), ("app", "b")])
    h.verify_marks(cast(HandlerContext, session), 0x4FF0, message)
    where = [(o.topic, o.partition, o.key) for o in session.written]
    assert where == [(f"walcast.app.{t}", p, None) for t in "ab" for p in range(3)]
    assert [op for op, _ in session.counted] == ["verify", "verify"]
    (ev,) = events(None, session.written[0].value)
    assert (ev["op"], ev["verify"], ev["table"]) == ("verify", {"id": "v-9"}, "a")
    assert ev["lsn"] == 0x4FF0


def test_verify_marks_off_writes_nothing() -> None:
    s = load_settings(
        Pg2KafkaSettings, env_file=None, http={"enabled": False},
        producer={"format": "debezium"}, debezium={"verify_marks": False},
    )  # fmt: skip
    h = cast(DebeziumCdc, cdc_handler(s, StreamTarget.cdc(s), None, cast(SourceLedger, Ledger())))
    session: Any = MarkSession(partitions=2)
    h.verify_marks(cast(HandlerContext, session), 0x4FF0, mark_message([("app", "a")]))
    assert session.written == []
