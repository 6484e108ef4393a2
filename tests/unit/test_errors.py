from __future__ import annotations

import ssl

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
    operator_hint,
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


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_COORDINATOR,  # the demo's first run: committed() on a new broker
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._WAIT_COORD,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
    ],
)
def test_kafka_errors_a_new_or_restarting_broker_gives_are_retriable(code: int) -> None:
    """librdkafka sets the retriable flag only on errors it raised itself; the same codes
    come back unflagged from committed() / list_topics()."""
    err = KafkaError(code)
    assert not err.retriable()
    assert is_retriable(KafkaException(err))


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


def test_psycopg_connection_failures_without_sqlstate() -> None:
    refused = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused'
    )
    assert classify(refused) is Verdict.RETRIABLE
    auth = psycopg.OperationalError(
        'connection failed: FATAL:  password authentication failed for user "walcast"'
    )
    assert classify(auth) is Verdict.PERMANENT
    assert "postgres.password" in operator_hint(auth)
    assert operator_hint(PermanentError("x", hint="do this")) == "do this"
    assert operator_hint(KeyError("bug")) == ""


def test_tls_misconfiguration_is_permanent_and_names_the_setting() -> None:
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed: unable to get issuer")
    wrapped = RuntimeError("request failed")
    wrapped.__cause__ = verify
    assert classify(wrapped) is Verdict.PERMANENT
    assert "ca_certs" in operator_hint(wrapped)
    refused = ssl.SSLError(1, "tlsv13 alert certificate required")
    refused.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    assert classify(refused) is Verdict.PERMANENT
    assert "client_cert" in operator_hint(refused)


def test_other_tls_failures_stay_retriable() -> None:
    eof = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")  # a dropped link
    assert classify(eof) is Verdict.RETRIABLE
    assert operator_hint(eof) == ""
