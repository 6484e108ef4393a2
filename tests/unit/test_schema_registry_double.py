"""The test double of a Confluent-compatible registry (tests/schema_registry.py), spoken to
by confluent-kafka's own registry client over HTTP: registration, lookups, compatibility
levels and Avro's resolution rules. (What the double is checked against is Avro's
specification; it stands in for a real registry, which cannot run here.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from tests.schema_registry import incompatibilities, running


def record(*fields: dict[str, Any], name: str = "Row") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "t", "fields": list(fields)})


ID = {"name": "id", "type": "long"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
INT_ID = {"name": "id", "type": "int"}
DOUBLE_ID = {"name": "id", "type": "double"}
NULLABLE_ID = {"name": "id", "type": ["null", "long"]}
INT_NOTE = {"name": "note", "type": "int"}


def test_the_real_client_registers_looks_up_and_is_refused_an_incompatible_schema() -> None:
    with running() as (url, registry):
        client = SchemaRegistryClient({"url": url})
        v1 = client.register_schema("s-value", Schema(record(ID), "AVRO"))
        assert client.register_schema("s-value", Schema(record(ID), "AVRO")) == v1
        v2 = client.register_schema("s-value", Schema(record(ID, NOTE), "AVRO"))
        assert v2 != v1
        assert json.loads(client.get_schema(v1).schema_str) == json.loads(record(ID))
        latest = client.get_latest_version("s-value")
        assert (latest.version, latest.schema_id) == (2, v2)
        assert client.lookup_schema("s-value", Schema(record(ID), "AVRO")).version == 1
        retyped = Schema(record({"name": "id", "type": "string"}), "AVRO")
        assert not client.test_compatibility("s-value", retyped)
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema("s-value", retyped)
        assert refused.value.http_status_code == 409
        assert "reader type string cannot read writer type long" in refused.value.error_message
        client.set_compatibility("s-value", "NONE")
        assert client.register_schema("s-value", retyped) not in (v1, v2)
        assert client.get_subjects() == ["s-value"]
        assert ("POST", "/subjects/s-value/versions") in registry.requests


@pytest.mark.parametrize(
    ("level", "new", "old", "compatible"),
    [
        ("BACKWARD", record(ID, NOTE), [record(ID)], True),  # a field with a default added
        ("BACKWARD", record(ID, {"name": "x", "type": "int"}), [record(ID)], False),
        ("FORWARD", record(ID, {"name": "x", "type": "int"}), [record(ID)], True),
        ("FORWARD", record(NOTE), [record(ID, NOTE)], False),  # old readers need id
        ("BACKWARD", record(NOTE), [record(ID, NOTE)], True),  # a field removed
        ("FULL", record(ID, NOTE), [record(ID)], True),
        ("BACKWARD", record(DOUBLE_ID), [record(INT_ID)], True),
        ("BACKWARD", record(INT_ID), [record(ID)], False),  # narrowing
        ("BACKWARD", record(NULLABLE_ID), [record(ID)], True),
        ("BACKWARD", record(ID), [record(NULLABLE_ID)], False),
        ("BACKWARD", record(ID, name="Other"), [record(ID)], False),
        ("BACKWARD_TRANSITIVE", record(NOTE), [record(INT_NOTE), record(NOTE)], False),
        ("BACKWARD", record(NOTE), [record(INT_NOTE), record(NOTE)], True),
        ("NONE", record({"name": "id", "type": "string"}), [record(ID)], True),
    ],
)  # fmt: skip
def test_compatibility_follows_avros_resolution_rules(
    level: str, new: str, old: list[str], compatible: bool
) -> None:
    assert (not incompatibilities(level, new, old)) is compatible
