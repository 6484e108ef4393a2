from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.pg2kafka.settings import (
    FilterSettings,
    ProducerSettings,
    ReplicationSettings,
    SubscriptionSettings,
)


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
