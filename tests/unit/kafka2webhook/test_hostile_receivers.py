"""Issue 36, findings 4 and 7: what a hostile receiver or record can do to kafka2webhook.

A receiver's headers and body are parsed totally (a huge ``Retry-After`` date once
crashed every endpoint); an attempt has an overall deadline (a trickling answer once held
a lane forever) and a stop is honoured within it; record values that become headers are
what pg2kafka writes or the record is dead-lettered; a ``whsec_`` secret must decode to a
real key. Real sockets on 127.0.0.1 (tests/webhook_receiver.py's RawServer), no Kafka."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Message
from prometheus_client import CollectorRegistry

from services.kafka2webhook.app import Item, WebhookSink, event_ident, events_record, lane_key
from services.kafka2webhook.client import Answer
from services.kafka2webhook.delivery import (
    Deliverer,
    Delivery,
    DeliveryMetrics,
    EndpointState,
    judge,
    verdict,
)
from services.kafka2webhook.settings import (
    DeliverySettings,
    EndpointSettings,
    Kafka2WebhookSettings,
)
from services.kafka2webhook.untrusted import RETRY_AFTER_CAP_S, retry_after_s
from shared.contract.event import EventDecodeError
from shared.errors import ConfigError, RetriableError, Verdict
from shared.interfaces import Origin
from shared.settings import load_settings
from tests.webhook_receiver import HUGE_RETRY_AFTER, RawServer, answer_hostile

SECRET = b"unit-test-secret-0123456789"
ORIGIN = Origin("t", 0, 5, b"k", b"{}")


@pytest.fixture
def raw() -> Iterator[RawServer]:
    server = RawServer()
    yield server
    server.stop()


def real_deliverer(url: str, stop: threading.Event | None = None, **delivery: Any) -> Deliverer:
    endpoint = EndpointSettings(name="e", url=url, secret=SECRET.decode())  # type: ignore[arg-type]
    settings = DeliverySettings(
        **{"jitter": 0.0, "initial_backoff_s": 0.05, "max_backoff_s": 0.1, **delivery}
    )
    return Deliverer(endpoint, SECRET, settings, DeliveryMetrics(CollectorRegistry()),
                     EndpointState(), stop=stop)  # fmt: skip


def timed(fn: Any, limit: float) -> tuple[Any, float]:
    """``fn()`` on a thread: its result (or exception) and how long it took; fails the
    test (without waiting for it) when it takes longer than ``limit``."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    began = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), f"still running after {limit} s"
    return out[0], time.monotonic() - began


# -- (a) parsing what a receiver controls is total ---------------------------------------


def test_retry_after_reads_hostile_values_without_raising() -> None:
    now = 1_700_000_000.0
    assert retry_after_s(HUGE_RETRY_AFTER, now) is None  # the year 99999999999: no date
    assert retry_after_s("Fri, 31 Dec 9999 23:59:59 GMT", now) == RETRY_AFTER_CAP_S
    assert retry_after_s("Thu, 01 Jan 1970 00:00:00 GMT", now) == 0.0  # past: no wait
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 +99999999999", now) is None
    assert retry_after_s("9" * 10_000, now) == RETRY_AFTER_CAP_S  # int() refuses 4300+
    for garbage in ("-5", "nan", "inf", "1e999", "1.5", " ", "\x00", "ÿþ 12", "Mon, 99 Foo"):
        assert retry_after_s(garbage, now) is None, garbage
    assert retry_after_s(" 30 ", now) == 30.0


def test_a_huge_retry_after_date_is_a_failed_attempt_not_a_crash(raw: RawServer) -> None:
    answers = ["huge-retry-after"]
    raw.answer = lambda c: (
        answer_hostile(c, answers.pop(0))
        if answers
        else c.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
    )
    d = real_deliverer(raw.url())
    reasons: list[str] = []
    record = d._failed
    d._failed = lambda reason: (reasons.append(reason), record(reason))[1]  # type: ignore[method-assign]
    slept: list[float] = []
    try:
        assert d.post(Delivery("wc_1", b"{}", (ORIGIN,)), slept.append) is None
    finally:
        d.close()
    # Unreadable: the backoff, never the year 99999999999. The raw server closes each
    # connection, so a pooled one may fail once more ("no answer") before the 204:
    # the first failed attempt is the 503, whatever came after it.
    assert slept[0] == 0.05
    assert max(slept) <= 0.1
    assert reasons, "no failed attempt was recorded"
    assert "HTTP 503" in reasons[0], reasons


def test_statuses_without_a_final_meaning_are_retried() -> None:
    for status in (100, 101, 199, 600, 999):
        assert verdict(status) is Verdict.RETRIABLE, status
    wait, reason = judge(Answer(302, location="\x1b[31mhttp://x/\r\nX-Evil: 1", body=b"\r\n"), 0)
    assert wait is None
    assert reason is not None
    assert "\r" not in reason
    assert "\n" not in reason
    assert "\x1b" not in reason
    wait, reason = judge(Answer(400, body=b"\xff\xfe bad \x00\x1b[2J" * 1000), 0)
    assert wait is None
    assert reason is not None
    assert len(reason) < 600
    assert reason.isprintable()


def test_odd_answers_are_failed_attempts(raw: RawServer) -> None:
    d = real_deliverer(raw.url(), timeout_s=2.0)
    try:
        for payload in (
            b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            b"HTTP/1.1 abc\r\n\r\n",
            b"garbage",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 503 X\r\n" + b"X: y\r\n" * 200 + b"\r\n",
            b"HTTP/1.1 503 X\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n\r\nabcde",
        ):
            raw.answer = lambda c, p=payload: c.sendall(p)  # type: ignore[misc]
            wait, reason = d._attempt(Delivery("wc_1", b"{}", (ORIGIN,)))
            assert wait is not None, (payload, reason)  # retried, never raised
            assert reason is not None
            assert reason.isprintable()
    finally:
        d.close()


# -- (b) an attempt has a deadline; a stop is honoured within it --------------------------


@pytest.mark.parametrize("behaviour", ["trickle-body", "trickle-headers"])
def test_a_trickling_answer_fails_the_attempt_at_its_deadline(
    raw: RawServer, behaviour: str
) -> None:
    raw.answer = lambda c: answer_hostile(c, behaviour)
    d = real_deliverer(raw.url(), timeout_s=0.6)
    try:
        (wait, reason), took = timed(lambda: d._attempt(Delivery("wc_1", b"{}", (ORIGIN,))), 10)
    finally:
        d.close()
    # Without the deadline the attempt would run on for as long as the receiver trickles
    # (past timed()'s 10 s); the bound leaves a loaded machine ample slack.
    assert took < 8.0, took
    assert wait == 0.0  # retried with the backoff
    assert "within" in reason  # its own deadline, or delivery.timeout_s for a 200's body


def test_stop_is_honoured_within_the_deadline(raw: RawServer) -> None:
    raw.answer = lambda c: answer_hostile(c, "trickle-body")
    stop = threading.Event()
    d = real_deliverer(raw.url(), stop=stop, timeout_s=1.0, parallel_keys=2)
    lanes = [[Delivery(f"wc_{lane}_{i}", b"{}", (ORIGIN,)) for i in range(5)] for lane in (1, 2)]

    def deliver() -> Any:
        return d.deliver(lanes, lambda s: stop.wait(s) and (_ for _ in ()).throw(
            RetriableError("stopping")))  # fmt: skip

    threading.Timer(0.3, stop.set).start()
    try:
        result, took = timed(deliver, 10)
    finally:
        d.close()
    assert isinstance(result, RetriableError)  # not committed: delivered after a restart
    assert took < 1.0 + 5.0, took  # the deadline, and a loaded machine's slack


def test_a_receiver_that_never_accepts_the_body_is_cut_too() -> None:
    # Accepts the connection, never reads: the request body fills the socket buffers.
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True).start()
    d = real_deliverer(f"http://127.0.0.1:{server.getsockname()[1]}/", timeout_s=0.5)
    try:
        body = b"x" * (32 * 1024 * 1024)
        (wait, reason), took = timed(lambda: d._attempt(Delivery("wc_1", body, (ORIGIN,))), 10)
    finally:
        d.close()
        server.close()
    assert took < 8.0
    assert wait == 0.0
    assert "within 0.5 s" in reason


# -- (c) record values that become headers ------------------------------------------------


def subscription(headers: list[tuple[str, str | bytes | None]]) -> Message:
    return Message(topic="ev", partition=0, offset=1, key=b"k", value=b'{"tg_name": "s"}',
                   headers=headers)  # fmt: skip


def test_event_ids_that_are_not_pg2kafkas_go_to_the_dead_letter_topic() -> None:
    for bad in (b"1\r\nX-Evil: yes", b"\xff\xfe", b"12 34", "é".encode(), b"1" * 129):
        with pytest.raises(EventDecodeError, match="not ids pg2kafka writes"):
            events_record(subscription([("walcast-event-id", bad), ("walcast-stream-id", b"1")]))
        with pytest.raises(EventDecodeError, match="not ids pg2kafka writes"):
            events_record(subscription([("walcast-event-id", b"7"), ("walcast-stream-id", bad)]))
    good = [("walcast-event-id", b"100"), ("walcast-stream-id", b"1")]
    first, again = events_record(subscription(good)), events_record(subscription(good))
    assert isinstance(first[0], Item)
    assert isinstance(again[0], Item)
    assert first[0].ident == again[0].ident == "evt_1_100"
    assert event_ident({}, b"{}") == event_ident({}, b"{}")  # no id header: a hash
    assert event_ident({}, b"{}").startswith("evt_")


def test_a_webhook_id_no_header_can_carry_is_refused_not_raised(raw: RawServer) -> None:
    d = real_deliverer(raw.url())
    try:
        wait, reason = d._attempt(Delivery("evt_1_1\r\nX-Evil: 1", b"{}", (ORIGIN,)))
    finally:
        d.close()
    assert wait is None
    assert "not a header value" in str(reason)
    assert raw.requests == []


def test_row_keys_and_bodies_json_cannot_handle_are_not_crashes() -> None:
    huge = Item(op="insert", schema="public", table="t", key={"id": 2**70}, body=b"{}",
                origin=Origin("t", 0, 1, b"public.t.1", b"{}"))  # fmt: skip
    assert lane_key(huge) == lane_key(huge)
    e = EndpointSettings(name="e", url="http://h/x", secret=SECRET.decode(),  # type: ignore[arg-type]
                         filter=[{"field": "new.a", "exists": True}])  # type: ignore[list-item]  # fmt: skip
    sink = WebhookSink(e, None, 4, lambda s: None, lambda o, r: None)  # type: ignore[arg-type]
    deep = b'{"op":"insert","new":' + b"[" * 2000 + b"]" * 2000 + b"}"
    item = Item(op="insert", schema="public", table="t", key={"id": 1}, body=deep,
                origin=Origin("t", 0, 1, None, deep))  # fmt: skip
    reason = sink.add(sink.new_batch(), item, item.origin)
    assert reason is not None
    assert "filter" in reason


# -- finding 7: secrets --------------------------------------------------------------------


def settings_with(secret: str, **endpoint: Any) -> Kafka2WebhookSettings:
    return load_settings(
        Kafka2WebhookSettings,
        endpoints=[{"name": "a", "url": "http://h/", "secret": secret, **endpoint}],
    )


def test_whsec_secrets_must_decode_to_a_real_key() -> None:
    refused = {
        "whsec_" + "!" * 32: "not standard base64",  # once an empty HMAC key
        "whsec_": "decodes to 0 bytes",
        "whsec_" + base64.b64encode(b"k" * 16).decode(): "decodes to 16 bytes",
        "whsec_" + base64.b64encode(b"k" * 25).decode().rstrip("="): "not standard base64",
        "whsec_" + base64.urlsafe_b64encode(b"\xff" * 30).decode(): "not standard base64",
        "whsec_ " + base64.b64encode(b"k" * 32).decode(): "not standard base64",
        "a-plain-secret-of-enough-bytes\n": "whitespace",
        "short": "has 5 bytes",
        "sixteen\x00bytes-long": "control characters",
    }
    for secret, message in refused.items():
        with pytest.raises(ConfigError, match=message) as caught:
            settings_with(secret)
        assert secret.strip() not in str(caught.value) or len(secret.strip()) < 8
    key = b"\x00\x01" * 12
    ok = settings_with("whsec_" + base64.b64encode(key).decode())
    assert ok.secret_of(ok.endpoints[0]) == b"whsec_" + base64.b64encode(key)


def test_headers_urls_and_the_deadline_are_validated_at_start_up() -> None:
    secret = "x" * 16
    for endpoint, message in (
        ({"headers": {"X-Team": "a\r\nX-Evil: 1"}}, "visible ASCII"),
        ({"headers": {"X-Team": "é"}}, "visible ASCII"),
        ({"headers": {"X Team": "a"}}, "not an HTTP token"),
        ({"url": "http://h:99999/"}, "http"),
    ):
        with pytest.raises(ConfigError, match=message):
            settings_with(secret, **endpoint)
    with pytest.raises(ConfigError, match="timeout_s"):
        load_settings(Kafka2WebhookSettings, delivery={"timeout_s": 60, "give_up_after_s": 30})


def test_the_removed_signature_tolerance_says_so() -> None:
    """It never did anything (receivers choose their own tolerance): a config that still
    sets it is told why it must go, not just that the key is unknown."""
    with pytest.raises(ConfigError, match=r"signature_tolerance_s was removed.*receiver"):
        load_settings(Kafka2WebhookSettings, delivery={"signature_tolerance_s": 300})
