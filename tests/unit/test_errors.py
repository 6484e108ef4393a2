from __future__ import annotations

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from shared.errors import (
    ConfigError,
    PermanentError,
    RetriableError,
    Verdict,
    classify,
    is_retriable,
)


class FakePgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    ("sqlstate", "verdict"),
    [
        ("28P01", Verdict.PERMANENT),  # invalid password
        ("28000", Verdict.PERMANENT),  # invalid authorization
        ("42501", Verdict.PERMANENT),  # insufficient privilege
        ("55000", Verdict.PERMANENT),  # object not in prerequisite state (wal_level)
        ("08006", Verdict.RETRIABLE),  # connection failure
        ("57P01", Verdict.RETRIABLE),  # admin shutdown
        ("53300", Verdict.RETRIABLE),  # too many connections
        ("40001", Verdict.RETRIABLE),  # serialization failure
    ],
)
def test_postgres_sqlstates(sqlstate: str, verdict: Verdict) -> None:
    assert classify(FakePgError(sqlstate)) is verdict


def _chained(outer: Exception, inner: Exception) -> Exception:
    outer.__cause__ = inner
    return outer


def test_real_psycopg_operational_error_without_sqlstate_walks_to_oserror() -> None:
    exc = _chained(psycopg.OperationalError("connection failed"), ConnectionRefusedError("x"))
    assert classify(exc) is Verdict.RETRIABLE


def test_kafka_errors() -> None:
    assert is_retriable(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert is_retriable(KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN)))
    assert not is_retriable(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    fatal = KafkaError(KafkaError._FATAL, fatal=True)
    assert not is_retriable(KafkaException(fatal))


def test_cause_chain_wins_over_unknown_wrapper() -> None:
    assert classify(_chained(ValueError("wrapped"), TimeoutError("slow"))) is Verdict.RETRIABLE


def test_own_hierarchy_and_unknowns() -> None:
    assert classify(RetriableError("x")) is Verdict.RETRIABLE
    assert classify(PermanentError("x")) is Verdict.PERMANENT
    assert classify(ConfigError("bad", hint="fix it")) is Verdict.PERMANENT
    assert classify(KeyError("bug")) is Verdict.PERMANENT
    assert "fix it" in str(ConfigError("bad", hint="fix it"))


def test_cycle_in_context_terminates() -> None:
    a = ValueError("a")
    b = ValueError("b")
    a.__context__ = b
    b.__context__ = a
    assert classify(a) is Verdict.PERMANENT
