"""The one exception hierarchy of walcast, and the one function that classifies failures.

Every error a service raises on purpose derives from :class:`WalcastError`. Whether a
failure is worth retrying is decided in exactly one place, :func:`classify`, which walks
the cause chain so adapters can wrap driver exceptions without losing the verdict.

* :class:`PermanentError` stops the service (or the item, for per-record errors) and
  carries ``hint``: what the operator must change. Retrying cannot help.
* :class:`RetriableError` is transient (a broker restarting, a connection reset); the
  retry wrapper backs off and tries again until its policy gives up.
"""

from __future__ import annotations

import ssl
from enum import Enum


class WalcastError(Exception):
    """Root of every error walcast raises on purpose."""


class PermanentError(WalcastError):
    """Retrying cannot help; ``hint`` tells the operator what to fix."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        self.hint = hint
        super().__init__(f"{message} — {hint}" if hint else message)


class ConfigError(PermanentError):
    """Configuration is invalid; raised at start-up before anything connects."""


class UnverifiableError(PermanentError):
    """A table ``verify`` cannot compare (it is gone, has no key, or a key without an order
    every side shares): said in that table's report; the other tables are verified."""


class TableStoppedError(PermanentError):
    """One table's change the target refused for good (kafka2postgres): that table stops,
    the others go on; the message says what the operator must fix."""


class RetriableError(WalcastError):
    """A transient failure: the operation may succeed if tried again later."""


class WaitExpiredError(RetriableError):
    """A wait for another service's progress ran out of time (a sink not applying a
    marker, a slot not passing it). Transient, but doing the same wait again at once only
    doubles it: a caller that starts whole operations again lets this one through."""


class NoAnswerError(RetriableError):
    """A broker request got no answer within its deadline. The client that sent it may
    be stuck (librdkafka can keep a request queued for a coordinator it never finds
    again after a broker restart): the caller drops that client and builds a new one."""


class RetriesExhaustedError(WalcastError):
    """A retriable operation kept failing until the backoff policy gave up."""

    def __init__(self, what: str, attempts: int, last: BaseException) -> None:
        self.what = what
        self.attempts = attempts
        self.last = last
        super().__init__(f"{what}: still failing after {attempts} attempts: {last}")


class Verdict(Enum):
    RETRIABLE = "retriable"
    PERMANENT = "permanent"


# Postgres SQLSTATE classes / codes. Class 28 (invalid authorization) and 42501
# (insufficient privilege) cannot be fixed by waiting; class 08 (connection exception),
# 53 (insufficient resources), 57P0x (shutdown / crash recovery) and 40001 / 40P01
# (serialization, deadlock) can.
_PG_PERMANENT_CLASSES = ("28", "3D", "42", "22", "23", "55")
_PG_PERMANENT_CODES = ("42501", "55000")
_PG_RETRIABLE_CLASSES = ("08", "53", "57", "58", "40")


def _pg_verdict(sqlstate: str) -> Verdict | None:
    if sqlstate in _PG_PERMANENT_CODES or sqlstate[:2] in _PG_PERMANENT_CLASSES:
        return Verdict.PERMANENT
    if sqlstate[:2] in _PG_RETRIABLE_CLASSES:
        return Verdict.RETRIABLE
    return None


def _kafka_verdict(exc: BaseException) -> Verdict | None:
    # confluent_kafka.KafkaException carries a KafkaError as args[0]; duck-typed so the
    # shared package does not import the client.
    err = exc.args[0] if exc.args else None
    fatal = getattr(err, "fatal", None)
    retriable = getattr(err, "retriable", None)
    if not callable(fatal) or not callable(retriable):
        return None
    if fatal():
        return Verdict.PERMANENT
    if retriable():
        return Verdict.RETRIABLE
    # librdkafka flags an error retriable only where it raised it itself; the same codes
    # reach us unflagged (e.g. NOT_COORDINATOR from committed() while a brand-new broker's
    # group coordinator is still loading: the demo's first run failed on it). Transport
    # and timeout errors are what a broker restart produces.
    name = getattr(err, "name", lambda: "")()
    if name in _KAFKA_TRANSIENT:
        return Verdict.RETRIABLE
    return Verdict.PERMANENT


_KAFKA_TRANSIENT = frozenset(
    {
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "_TIMED_OUT",
        "_TIMED_OUT_QUEUE",
        "_MSG_TIMED_OUT",
        "_RESOLVE",
        "_WAIT_COORD",
        "NETWORK_EXCEPTION",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "REQUEST_TIMED_OUT",
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_CONTROLLER",
        "REBALANCE_IN_PROGRESS",
        "KAFKA_STORAGE_ERROR",
        "FETCH_SESSION_ID_NOT_FOUND",
        "UNSTABLE_OFFSET_COMMIT",
    }
)


# libpq reports connection failures as text, without SQLSTATE: these say the
# configuration is wrong (waiting will not help); any other connection failure is
# transient (server restarting, network).
_PG_CONNECT_PERMANENT = {
    "password authentication failed": "check postgres.user and postgres.password",
    "no pg_hba.conf entry": "allow this host/user in pg_hba.conf (and replication for it)",
    "does not exist": "check postgres.database and postgres.user",
    "SSL is not enabled on the server": "set postgres.sslmode to disable or prefer",
    "permission denied": "grant the role what the message names",
}


def _pg_connection_verdict(exc: BaseException) -> Verdict | None:
    if type(exc).__name__ != "OperationalError" or not type(exc).__module__.startswith("psycopg"):
        return None
    text = str(exc)
    if any(marker in text for marker in _PG_CONNECT_PERMANENT):
        return Verdict.PERMANENT
    return Verdict.RETRIABLE


def http_status_verdict(status: int) -> Verdict:
    """An HTTP answer from a search engine or a webhook receiver, for a whole request or
    one bulk item: request timeouts (408), too early (425), too many requests (429) and
    server-side failures pass; any other 4xx will not change by waiting."""
    if status in (408, 425, 429) or status >= 500:
        return Verdict.RETRIABLE
    return Verdict.PERMANENT


_SEARCH_CLIENT_MODULES = ("elasticsearch", "opensearchpy", "elastic_transport")
_HTTP_HINTS = {
    401: "check the search engine credentials (username / password or API key)",
    403: "grant the search engine user the index privileges walcast needs",
}


def _search_client_verdict(exc: BaseException) -> Verdict | None:
    """opensearch-py and elasticsearch-py errors, duck-typed (the shared package does not
    import either client): a connection failure has no integer status and passes."""
    if not type(exc).__module__.startswith(_SEARCH_CLIENT_MODULES):
        return None
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return http_status_verdict(status)
    name = type(exc).__name__
    if "Connection" in name or "Timeout" in name:
        return Verdict.RETRIABLE
    return None


# TLS failures that no retry can fix: the peer's certificate does not verify against the
# configured CA, or the peer refused ours (missing, unknown CA, not accepted).
_TLS_REFUSED_REASONS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
}


def _tls_hint(exc: BaseException) -> str | None:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (
            "the server's TLS certificate did not verify: check the CA file (ca_certs) or"
            " verify_certs, and that the URL's host name is in the certificate"
        )
    if isinstance(exc, ssl.SSLError) and getattr(exc, "reason", None) in _TLS_REFUSED_REASONS:
        return (
            "the server refused the TLS client certificate: set client_cert / client_key to"
            " a certificate its CA trusts"
        )
    return None


def operator_hint(exc: BaseException) -> str:
    """What the operator should change for a permanent failure, when we can tell."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, PermanentError) and current.hint:
            return current.hint
        status = getattr(current, "status_code", None)
        if isinstance(status, int) and status in _HTTP_HINTS:
            return _HTTP_HINTS[status]
        tls = _tls_hint(current)
        if tls is not None:
            return tls
        text = str(current)
        for marker, hint in _PG_CONNECT_PERMANENT.items():
            if marker in text:
                return hint
        current = current.__cause__ or current.__context__
    return ""


def _one(exc: BaseException) -> Verdict | None:
    if isinstance(exc, PermanentError):
        return Verdict.PERMANENT
    if isinstance(exc, RetriableError):
        return Verdict.RETRIABLE
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and len(sqlstate) == 5:
        return _pg_verdict(sqlstate)
    verdict = _pg_connection_verdict(exc)
    if verdict is not None:
        return verdict
    if type(exc).__name__ == "KafkaException":
        return _kafka_verdict(exc)
    verdict = _search_client_verdict(exc)
    if verdict is not None:
        return verdict
    if _tls_hint(exc) is not None:
        return Verdict.PERMANENT
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return Verdict.RETRIABLE
    if isinstance(exc, OSError):
        return Verdict.RETRIABLE
    return None


def classify(exc: BaseException) -> Verdict:
    """Decide whether ``exc`` is worth retrying.

    Walks ``__cause__`` / ``__context__`` from the outermost exception inwards and returns
    the first definite verdict. Anything unrecognised is permanent: retrying a bug forever
    would hide it, and a crash with a traceback is the honest outcome.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _one(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return Verdict.PERMANENT


def is_retriable(exc: BaseException) -> bool:
    return classify(exc) is Verdict.RETRIABLE
