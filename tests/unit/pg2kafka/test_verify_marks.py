"""Verification markers (docs/design.md#verification, docs/events.md "Verification
markers"): a signed ``walcast.verify`` message becomes one ``op: verify`` event per named
table, valid under the contract and its JSON Schema; a malformed one is skipped, never a
stop; the sinks apply nothing for one (kafka2spark cuts no segment at it)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from services.kafka2spark.plan import Control, cuts
from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder
from services.pg2kafka.types import TypeRegistry
from shared.contract.event import CONTROL_OPS, EventDecodeError, decode

SCHEMA = json.loads((Path(__file__).parents[3] / "shared/schemas/change_event.v1.json").read_text())


def builder() -> EventBuilder:
    b = EventBuilder("db1", TypeRegistry())
    b.begin(pg.Begin(900, 1_700_000_000_000_000, 41))
    return b


def mark(payload: Any) -> pg.Message:
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return pg.Message(True, 880, "walcast.verify", body)


def test_a_mark_is_one_event_per_table_in_its_transaction() -> None:
    b = builder()
    tables = [{"schema": "app", "table": "orders"}, {"schema": 'Odd "s"', "table": "t.1"}]
    events = b.verify_marks(mark({"id": "k2s-1", "tables": tables}), 880)
    assert [(e["schema"], e["table"]) for e in events] == [("app", "orders"), ('Odd "s"', "t.1")]
    for e in events:
        assert e["op"] == "verify"
        assert e["verify"] == {"id": "k2s-1"}
        assert (e["key"], e["new"], e["old"]) == ({}, None, None)
        assert (e["lsn"], e["commit_lsn"], e["xid"]) == (880, 900, 41)
        raw = orjson.dumps(e)
        jsonschema.validate(orjson.loads(raw), SCHEMA)
        view = decode(raw)
        assert view.op in CONTROL_OPS
        assert view.verify == {"id": "k2s-1"}
    assert [e["seq"] for e in events] == [0, 1]


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        {"tables": []},
        {"id": "", "tables": []},
        {"id": "x" * 201, "tables": []},
        {"id": 7, "tables": []},
        {"id": "m", "tables": "app.orders"},
        {"id": "m", "tables": [{"schema": "app"}]},
        [1, 2],
    ],
)
def test_a_malformed_mark_is_skipped_and_said(
    payload: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert builder().verify_marks(mark(payload), 880) == []
    assert "malformed verification mark" in caplog.text


@pytest.mark.parametrize(
    ("verify", "error"),
    [(None, "without a 'verify' object"), ({"id": 5}, "string 'id'"),
     ({"id": ""}, "of 0 characters"), ({"id": "y" * 201}, "of 201 characters")],
)  # fmt: skip
def test_the_decoder_refuses_a_marker_without_a_proper_id(verify: Any, error: str) -> None:
    ev = {"v": 1, "op": "verify", "db": "d", "schema": "s", "table": "t", "lsn": 1, "seq": 0,
          "commit_lsn": 1, "xid": 1, "commit_ts": "2026-01-01T00:00:00Z", "key": {},
          "new": None, "old": None}  # fmt: skip
    if verify is not None:
        ev["verify"] = verify
    with pytest.raises(EventDecodeError, match=error):
        decode(orjson.dumps(ev))


def test_the_mirror_cuts_no_segment_at_a_marker() -> None:
    c = Control("db.s.t", 5, 0, "verify", None, {"db": "db", "schema": "s", "table": "t"})
    assert cuts(c) is False
