"""The CDC handler of each output format (services/pg2kafka/cdc.py), chosen once from the
settings: what both formats owe the stream whatever they write — the source's ledger
follows the confirmed position (a restored copy of the database is told from it)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from services.pg2kafka.cdc import CdcHandler, DebeziumCdc, WalcastCdc, cdc_handler
from services.pg2kafka.session import HandlerContext
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.source import SourceLedger
from services.pg2kafka.topics import StreamTarget
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
