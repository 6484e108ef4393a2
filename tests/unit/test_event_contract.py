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


# -- snapshots: read rows and markers ---------------------------------------------------

READ = {"v": 1, "op": "read", "db": "d", "schema": "s", "table": "t", "lsn": 1023, "seq": 4,
        "commit_lsn": 1023, "xid": 0, "commit_ts": "2026-01-01T00:00:00Z", "key": {"id": 1},
        "new": {"id": 1, "v": "a"}, "old": None, "types": {"id": "int4", "v": "text"},
        "snapshot": {"id": 3, "chunk": 2}}  # fmt: skip


def marker(**snapshot: Any) -> dict[str, Any]:
    """An ``op: snapshot`` marker, fields in the producer's order."""
    return {k: v for k, v in READ.items() if k != "types"} | {
        "op": "snapshot", "seq": 0, "key": {}, "new": None, "old": None, "snapshot": snapshot,
    }  # fmt: skip


def test_a_read_row_is_a_data_event_decoded_like_an_insert() -> None:
    assert event.Op.READ in event.DATA_OPS
    jsonschema.validate(READ, SCHEMA)
    view = event.decode(json.dumps(READ).encode())
    assert (view.op, view.lsn, view.key) == ("read", 1023, {"id": 1})
    assert view.row() == {"id": 1, "v": "a"}
    assert view.column_types() == {"id": "int4", "v": "text"}
    assert view.snapshot == {"id": 3, "chunk": 2}
    # the decoder asks no snapshot of a read row (the schema, the producer's side, does)
    no_info = {k: v for k, v in READ.items() if k != "snapshot"}
    assert event.decode(json.dumps(no_info).encode()).snapshot is None


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        pytest.param(READ | {"new": None}, "read without a 'new' row", id="no-new"),
        pytest.param({k: v for k, v in READ.items() if k != "key"}, "'key'", id="no-key"),
        pytest.param(READ | {"snapshot": 3}, "'snapshot' is not an object", id="snapshot-int"),
        pytest.param(READ | {"snapshot": [3]}, "'snapshot' is not an object", id="snapshot-list"),
    ],
)
def test_a_bad_read_row_is_refused_with_the_reason(bad: dict[str, Any], reason: str) -> None:
    with pytest.raises(event.EventDecodeError, match=re.escape(reason)):
        event.decode(json.dumps(bad).encode())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


@pytest.mark.parametrize(
    "info",
    [{"id": 3, "phase": "start"}, {"id": 3, "phase": "end", "rows": 0}],
    ids=["start", "end"],
)
def test_snapshot_markers_are_control_events(info: dict[str, Any]) -> None:
    assert event.Op.SNAPSHOT in event.CONTROL_OPS
    ev = marker(**info)
    jsonschema.validate(ev, SCHEMA)
    view = event.decode(json.dumps(ev).encode())
    assert (view.op, view.lsn, view.snapshot) == ("snapshot", 1023, info)
    assert list(ev) == [f for f in event.FIELDS if f in ev]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        pytest.param(
            {k: v for k, v in marker().items() if k != "snapshot"},
            "without a 'snapshot' object",
            id="no-snapshot",
        ),
        pytest.param(marker() | {"snapshot": None}, "without a 'snapshot'", id="snapshot-null"),
        pytest.param(marker() | {"snapshot": "end"}, "without a 'snapshot'", id="snapshot-str"),
        pytest.param(marker(id=3), "'phase' missing", id="no-phase"),
        pytest.param(marker(id=3, phase="middle"), "'phase' missing or not", id="phase-unknown"),
        pytest.param(marker(id=3, phase=5), "'phase' missing or not", id="phase-int"),
        pytest.param(marker(id=3, phase="END"), "'phase' missing or not", id="phase-case"),
        pytest.param(marker(phase="start"), "'id' missing", id="no-id"),
        pytest.param(marker(id="3", phase="start"), "'id' missing or not", id="id-str"),
        pytest.param(marker(id=3.5, phase="start"), "'id' missing or not", id="id-float"),
        pytest.param(marker(id=True, phase="start"), "'id' missing or not", id="id-bool"),
        pytest.param(marker(id=-1, phase="start"), "'id' missing or not", id="id-negative"),
    ],
)
def test_a_bad_snapshot_marker_is_refused_with_the_reason(bad: dict[str, Any], reason: str) -> None:
    with pytest.raises(event.EventDecodeError, match=re.escape(reason)):
        event.decode(json.dumps(bad).encode())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_a_snapshot_id_beyond_a_long_is_refused() -> None:
    """kafka2spark reads the id as a long."""
    with pytest.raises(event.EventDecodeError, match="'id' missing or not"):
        event.decode(json.dumps(marker(id=2**63, phase="start")).encode())


def test_the_schema_asks_the_end_marker_for_its_row_count() -> None:
    with pytest.raises(jsonschema.ValidationError, match="'rows' is a required property"):
        jsonschema.validate(marker(id=3, phase="end"), SCHEMA)


# -- epochs: the version across a change of source ---------------------------------------


def test_the_epoch_orders_before_the_lsn() -> None:
    """A change of a later epoch (a restored or promoted source) outranks every change of
    an earlier one, however low its LSN; without ``epoch`` the version is the LSN."""
    old = event.decode(json.dumps(READ | {"lsn": 0x5_0000_0000}).encode())
    new = event.decode(json.dumps(READ | {"lsn": 0x100, "epoch": 1}).encode())
    assert old.version() == 0x5_0000_0000 == event.version(0, 0x5_0000_0000)
    assert new.version() == (1 << event.EPOCH_SHIFT) + 0x100 == event.version(1, 0x100)
    assert new.version() > old.version()
    jsonschema.validate(READ | {"epoch": 1}, SCHEMA)
    top = event.version(event.MAX_EPOCH, event.MAX_EPOCH_LSN)
    assert top <= event.MAX_LSN  # a search engine's external version (a Java long)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        pytest.param({"epoch": -1}, "'epoch' not an integer", id="negative"),
        pytest.param({"epoch": "1"}, "'epoch' not an integer", id="text"),
        pytest.param({"epoch": event.MAX_EPOCH + 1}, "'epoch' not an integer", id="too-large"),
        pytest.param({"epoch": 2, "lsn": 2**48}, "above 2^48-1 in epoch 2", id="lsn-too-large"),
    ],
)
def test_a_bad_epoch_is_refused_with_the_reason(fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(event.EventDecodeError, match=re.escape(reason)):
        event.decode(json.dumps(READ | fields).encode())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(READ | fields, SCHEMA)


def test_a_read_row_is_above_its_tables_floor_and_below_what_it_did_not_see() -> None:
    assert event.read_row_version(99, None) == 99
    assert event.read_row_version(99, 50) == 99
    assert event.read_row_version(99, 150) == 151  # created after the slot's restart point
