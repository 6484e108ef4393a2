"""The event contract in code, the JSON Schema and kafka2spark's envelope agree."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from services.kafka2spark.schema import ENVELOPE
from shared.contract import event

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "shared/schemas/change_event.v1.json").read_text())


def doc_examples() -> list[dict[str, Any]]:
    """Every JSON example of docs/events.md."""
    text = (REPO / "docs/events.md").read_text()
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.S)]


def test_the_schema_is_the_contract() -> None:
    assert tuple(SCHEMA["properties"]) == event.FIELDS
    assert tuple(SCHEMA["required"]) == event.REQUIRED
    assert set(SCHEMA["properties"]["op"]["enum"]) == event.OPS
    assert SCHEMA["properties"]["v"]["const"] == event.EVENT_VERSION
    assert set(SCHEMA["properties"]["ddl"]["properties"]) == set(event.DdlChange.__annotations__)
    assert tuple(event.ChangeEvent.__annotations__) == event.FIELDS


def test_kafka2sparks_envelope_declares_every_field_in_order() -> None:
    assert tuple(ENVELOPE.fieldNames()) == event.FIELDS


def test_docs_have_an_example_of_every_operation() -> None:
    assert {e["op"] for e in doc_examples()} == event.OPS


@pytest.mark.parametrize("example", doc_examples(), ids=lambda e: f"{e['op']}-{e['lsn']}")
def test_every_docs_example_passes_the_schema_and_the_decoder(example: dict[str, Any]) -> None:
    jsonschema.validate(example, SCHEMA)
    data = json.dumps(example).encode()
    view = event.decode(data)
    assert view.op == example["op"]
    assert event.JsonEventSerializer().decode(data) == example
    assert list(example) == [f for f in event.FIELDS if f in example]  # the producer's order


def test_a_reference_to_an_oversized_change_is_refused_with_the_reason() -> None:
    """pg2kafka sends a reference (rows left out, ``oversized`` = the size) for a change
    larger than its topic takes; consumers dead-letter it, saying what to do."""
    ref = {"v": 1, "op": "insert", "db": "d", "schema": "s", "table": "t", "lsn": 7,
           "seq": 0, "commit_lsn": 7, "xid": 1, "commit_ts": "2026-01-01T00:00:00Z",
           "key": {"id": 1}, "new": None, "old": None, "oversized": 20_000_000}  # fmt: skip
    with pytest.raises(event.EventDecodeError, match=r"20000000 bytes.*re-snapshot"):
        event.decode(json.dumps(ref).encode())
