from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.pg2kafka.settings import (
    FilterSettings,
    Pg2KafkaSettings,
    ProducerSettings,
    ReplicationSettings,
    SubscriptionSettings,
)
from services.pg2kafka.topics import producer_config


@pytest.mark.parametrize("name", ["MyPub", "a,b", "with space", "", "x" * 64])
def test_slot_and_publication_names_are_plain(name: str) -> None:
    for cls in (ReplicationSettings, SubscriptionSettings):
        for field in ("slot", "publication"):
            with pytest.raises(ValidationError, match="a-z, 0-9 and _"):
                cls(**{field: name})


def test_wal_sender_timeout_must_exceed_the_status_interval() -> None:
    with pytest.raises(ValidationError, match="twice status_interval_s"):
        ReplicationSettings(status_interval_s=5, wal_sender_timeout_s=8)
    assert ReplicationSettings(status_interval_s=1, wal_sender_timeout_s=5)


def test_topic_template_placeholders() -> None:
    assert ProducerSettings(topic_template="cdc.{schema}.{table}")
    with pytest.raises(ValidationError, match="unknown placeholder"):
        ProducerSettings(topic_template="cdc.{tabel}")


def test_filters() -> None:
    assert FilterSettings().all_tables
    assert not FilterSettings(include=["app.*"]).all_tables
    with pytest.raises(ValidationError, match=r"schema\.table"):
        FilterSettings(include=["no_dot"])


def _debezium(**sections: object) -> Pg2KafkaSettings:
    base: dict[str, object] = {
        "producer": {"format": "debezium"},
        "snapshot": {"mode": "never", "automatic": False},
    }
    base.update(sections)
    return Pg2KafkaSettings.model_validate(base)


def test_the_debezium_format_takes_initial_and_incremental_snapshots() -> None:
    s = _debezium()
    assert (s.debezium.topic_prefix, s.debezium.schemas, s.debezium.tombstones) == (
        "walcast",
        True,
        True,
    )
    for mode in ("initial", "initial_only"):
        assert _debezium(snapshot={"mode": mode, "automatic": False}).snapshot.mode == mode
    # incremental snapshots (automatic ones too) are written in this format as well
    assert _debezium(snapshot={"mode": "never", "automatic": True}).snapshot.automatic
    with pytest.raises(ValidationError, match="topic_template does not apply"):
        _debezium(producer={"format": "debezium", "topic_template": "x.{table}"})
    with pytest.raises(ValidationError, match="topic prefix is letters"):
        _debezium(debezium={"topic_prefix": "bad prefix"})


def test_the_debezium_format_partitions_as_kafka_connect() -> None:
    assert producer_config(_debezium())["partitioner"] == "murmur2_random"
    assert "partitioner" not in producer_config(Pg2KafkaSettings())


def test_the_avro_encoding_is_checked_at_start_up() -> None:
    def avro(**sections: object) -> Pg2KafkaSettings:
        base: dict[str, object] = {
            "producer": {"encoding": "avro"},
            "snapshot": {"mode": "never", "automatic": False},
            "schema_registry": {"url": "http://registry:8081",
                                "subject_name_strategy": "topic_record"},
        }  # fmt: skip
        base.update(sections)
        return Pg2KafkaSettings.model_validate(base)

    assert avro().producer.encoding == "avro"
    with pytest.raises(ValidationError, match=r"needs schema_registry\.url"):
        avro(schema_registry={})
    with pytest.raises(ValidationError, match="several tables"):
        avro(schema_registry={"url": "http://r:8081"})  # topic: one schema per topic
    per_table = {"encoding": "avro", "topic_template": "cdc.{schema}.{table}"}
    assert avro(producer=per_table, schema_registry={"url": "http://r:8081"})
    assert avro(snapshot={"mode": "initial", "automatic": True}).snapshot.automatic
    # The Debezium format's topics are per table: the topic strategy fits.
    dbz = avro(producer={"encoding": "avro", "format": "debezium"},
               schema_registry={"url": "http://r:8081"}, snapshot={"automatic": False})  # fmt: skip
    assert dbz.producer.format == "debezium"
    with pytest.raises(ValidationError, match=r"schema_registry\.url"):
        avro(schema_registry={"url": "ftp://x"})
