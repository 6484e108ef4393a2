"""pg2kafka's output seam (services/pg2kafka/output.py): the one place that decides on
the output format and the encoding."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import orjson

from services.pg2kafka.output import (
    FORMATS,
    AvroValues,
    JsonValues,
    connect_encoder,
    output_format,
    reference,
    value_encoder,
)
from services.pg2kafka.settings import Pg2KafkaSettings, ProducerSettings

PG2KAFKA = Path(__file__).resolve().parents[3] / "services" / "pg2kafka"
# Testing the format or the encoding, or the Debezium session's options, by hand.
DECIDES = re.compile(
    r"""\.format\s*[!=]=|\.encoding\s*[!=]=|\bavro\s+is\s+(not\s+)?None|["']debezium["']"""
    r"""|DEBEZIUM_SESSION_OPTIONS"""
)
ALLOWED = {
    "output.py",  # the seam
    "settings.py",  # the model, and what it refuses at start-up
    "replication.py",  # where the Debezium session's options are written down
    "debezium_format.py",  # the Debezium records, over the encoder the seam gave them
}


def test_no_module_outside_the_seam_decides_on_format_or_encoding() -> None:
    offenders = []
    for path in sorted(PG2KAFKA.rglob("*.py")):
        if path.name in ALLOWED and path.parent == PG2KAFKA:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if DECIDES.search(line.split("#", 1)[0]):
                offenders.append(f"{path.relative_to(PG2KAFKA)}:{n}: {line.strip()}")
    assert not offenders, "ask services/pg2kafka/output.py instead:\n" + "\n".join(offenders)


def test_the_grep_recognises_a_decision() -> None:
    assert DECIDES.search('if settings.producer.format == "debezium":')
    assert DECIDES.search("value = x if self.avro is None else y")
    assert not DECIDES.search("fmt = output_format(settings)")


def test_every_format_the_settings_accept_has_its_facts() -> None:
    formats = typing.get_args(ProducerSettings.model_fields["format"].annotation)
    assert set(formats) == set(FORMATS)
    assert output_format(Pg2KafkaSettings()).name == "walcast"
    dbz = Pg2KafkaSettings(producer={"format": "debezium"}, snapshot={"automatic": False})
    facts = output_format(dbz)
    assert facts.connect_records
    assert not facts.table_wide_events
    assert not facts.source_epochs  # a new source's snapshot cannot outrank an old one
    assert facts.per_table_topics
    assert facts.session_options  # the text pgoutput sends as Debezium's converters read it


def test_the_encoding_is_chosen_once_from_the_settings() -> None:
    assert isinstance(value_encoder(Pg2KafkaSettings()), JsonValues)
    avro = Pg2KafkaSettings(
        producer={"encoding": "avro", "topic_template": "{schema}.{table}"},
        schema_registry={"url": "mock://walcast-output-seam"},
    )
    assert isinstance(value_encoder(avro), AvroValues)
    assert connect_encoder(avro) is None  # walcast's events: no Connect records
    assert connect_encoder(Pg2KafkaSettings()) is None


def test_a_reference_keeps_the_event_but_its_rows() -> None:
    ev = {"v": 1, "op": "update", "schema": "s", "table": "t", "lsn": 5, "key": {"id": 1},
          "new": {"id": 1, "big": "x" * 10}, "old": {"id": 1},
          "unchanged_toast": ["b"]}  # fmt: skip
    ref = reference(ev, 12345)
    assert ref == {"v": 1, "op": "update", "schema": "s", "table": "t", "lsn": 5,
                   "key": {"id": 1}, "new": None, "old": None, "oversized": 12345}  # fmt: skip
    assert orjson.loads(JsonValues().encode("topic", ref)) == ref


def test_a_formats_records_are_chosen_once_per_component() -> None:
    """Whether rows become Kafka Connect records picks a strategy once: the stream's
    handler (cdc.py ``cdc_handler``), a snapshot reader's rows (snapshots/readers.py,
    snapshots/rows.py's strategies) and the destination the source ledger names
    (source.py) — nowhere per record."""
    readers = {
        str(path.relative_to(PG2KAFKA))
        for path in PG2KAFKA.rglob("*.py")
        if path.name != "output.py" and ".connect_records" in path.read_text()
    }
    assert readers == {"cdc.py", "snapshots/readers.py", "source.py"}
