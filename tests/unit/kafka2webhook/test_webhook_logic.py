"""kafka2webhook's logic without Kafka or sockets: signatures, what is retried and for how
long, Retry-After, subscriptions and filters, lanes and per-key order, settings. Against
Kafka and a real receiver: tests/integration/kafka2webhook/test_webhooks.py."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from services.kafka2webhook import signing
from services.kafka2webhook.app import Item, WebhookSink, as_delivery, holds
from services.kafka2webhook.delivery import (
    Deliverer,
    Delivery,
    DeliveryMetrics,
    EndpointState,
    verdict,
)
from services.kafka2webhook.settings import (
    Condition,
    DeliverySettings,
    EndpointSettings,
    Kafka2WebhookSettings,
)
from services.kafka2webhook.untrusted import retry_after_s
from shared.errors import ConfigError, Verdict
from shared.interfaces import Origin
from shared.settings import load_settings

SECRET = b"unit-test-secret-0123456789"


def test_signatures_verify_and_refuse_tampering_old_timestamps_and_other_keys() -> None:
    body = b'{"op":"insert"}'
    h = signing.headers(SECRET, "wc_1", body, now=1_700_000_000)
    assert signing.verify(SECRET, h, body, now=1_700_000_100) == "wc_1"
    with pytest.raises(signing.SignatureError, match="no signature matches"):
        signing.verify(SECRET, h, body + b" ", now=1_700_000_100)
    with pytest.raises(signing.SignatureError, match="no signature matches"):
        signing.verify(b"another-secret-of-16+", h, body, now=1_700_000_100)
    with pytest.raises(signing.SignatureError, match="tolerance"):
        signing.verify(SECRET, h, body, now=1_700_000_000 + 301)  # a replay, later
    with pytest.raises(signing.SignatureError, match="missing"):
        signing.verify(SECRET, {"webhook-id": "x"}, body)
    # Rotation: the receiver accepts any of several signatures.
    rotated = {**h, "webhook-signature": "v1,AAAA " + h["webhook-signature"]}
    assert signing.verify(SECRET, rotated, body, now=1_700_000_000) == "wc_1"


def test_whsec_secrets_are_their_base64_bytes_as_standard_webhooks_has_it() -> None:
    key = b"\x01\x02binary key bytes"
    secret = b"whsec_" + base64.b64encode(key)
    # The scheme's published example: id.timestamp.body, HMAC-SHA256, base64, "v1,".
    import hashlib
    import hmac

    mac = hmac.new(key, b"msg_1.1700000000.{}", hashlib.sha256).digest()
    assert signing.signature(secret, "msg_1", 1_700_000_000, b"{}") == (
        "v1," + base64.b64encode(mac).decode()
    )


def test_what_is_retried() -> None:
    for status in (408, 425, 429, 500, 502, 503, 504):
        assert verdict(status) is Verdict.RETRIABLE, status
    for status in (301, 302, 400, 401, 403, 404, 410, 413, 422):
        assert verdict(status) is Verdict.PERMANENT, status


def test_retry_after_seconds_or_http_date() -> None:
    assert retry_after_s("7", 0) == 7
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", 1445412480) == 10
    assert retry_after_s("soon", 0) is None
    assert retry_after_s("²", 0) is None  # a digit to str.isdigit, not to float
    assert retry_after_s(None, 0) is None


@dataclass
class FakeResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    _sent: int = 0

    def read(self, amt: int, **__: Any) -> bytes:
        chunk = self.body[self._sent : self._sent + amt]
        self._sent += len(chunk)
        return chunk

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


@dataclass
class FakePool:
    """Answers in turn (an exception is raised as the connection failure it is)."""

    answers: list[FakeResponse | Exception]
    sent: list[dict[str, Any]] = field(default_factory=list)

    def request(self, method: str, url: str, **kw: Any) -> FakeResponse:
        self.sent.append(kw)
        answer = self.answers.pop(0) if self.answers else FakeResponse(200)
        if isinstance(answer, Exception):
            raise answer
        return replace(answer, _sent=0)  # one answer may be listed many times

    def clear(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def deliverer(pool: FakePool, clock: Clock, **delivery: Any) -> Deliverer:
    endpoint = EndpointSettings(name="e", url="http://127.0.0.1:1/hook", secret=SECRET.decode())  # type: ignore[arg-type]
    settings = DeliverySettings(**{"jitter": 0.0, "initial_backoff_s": 1.0, **delivery})
    return Deliverer(endpoint, SECRET, settings, DeliveryMetrics(CollectorRegistry()),
                     EndpointState(), pool=pool, clock=clock)  # fmt: skip


ORIGIN = Origin("t", 0, 5, b"k", b"{}")


def test_retries_back_off_honour_retry_after_and_sign_each_attempt() -> None:
    pool = FakePool([OSError("refused"), FakeResponse(503, {"retry-after": "7"}),
                     FakeResponse(500), FakeResponse(204)])  # fmt: skip
    clock = Clock()
    d = deliverer(pool, clock)
    assert d.post(Delivery("wc_1", b"{}", (ORIGIN,)), clock.sleep) is None
    assert clock.slept == [1.0, 7.0, 4.0]  # backoff, Retry-After, backoff doubled twice
    assert len(pool.sent) == 4
    assert {kw["headers"]["webhook-id"] for kw in pool.sent} == {"wc_1"}
    assert d.state.snapshot()["failing"] is False  # a success clears it
    assert "HTTP 500" in str(d.state.last_error)


def test_a_permanent_answer_is_given_up_at_once_with_status_and_body() -> None:
    pool = FakePool([FakeResponse(410, body=b'{"error": "this hook is gone"}')])
    clock = Clock()
    reason = deliverer(pool, clock).post(Delivery("wc_1", b"{}", (ORIGIN,)), clock.sleep)
    assert reason is not None
    assert "HTTP 410" in reason
    assert "this hook is gone" in reason
    assert clock.slept == []


def test_the_retry_budget_ends_in_a_dead_letter_reason() -> None:
    pool = FakePool([FakeResponse(503, body=b"busy")] * 100)
    clock = Clock()
    d = deliverer(pool, clock, give_up_after_s=20.0, max_backoff_s=8.0)
    reason = d.post(Delivery("wc_1", b"{}", (ORIGIN,)), clock.sleep)
    assert reason is not None
    assert reason.startswith("gave up on e after")
    assert "HTTP 503: busy" in reason
    assert sum(clock.slept) <= 20.0
    pool = FakePool([FakeResponse(503)] * 100)
    d = deliverer(pool, Clock(), max_attempts=3)
    assert "after 3 attempt(s)" in str(d.post(Delivery("x", b"{}", (ORIGIN,)), lambda s: None))


def item(op: str, table: str, row: int, lsn: int, **new: Any) -> Item:
    body = orjson.dumps({"op": op, "schema": "public", "table": table, "lsn": lsn,
                         "key": {"id": row}, "new": {"id": row, **new}})  # fmt: skip
    return Item(v=1, op=op, schema="public", table=table, key={"id": row}, lsn=lsn,
                ident=f"wc_{lsn}", body=body, origin=Origin("t", 0, lsn, None, body))  # fmt: skip


def sink(**endpoint: Any) -> WebhookSink:
    e = EndpointSettings(
        **{"name": "e", "url": "http://h/x", "secret": SECRET.decode(), **endpoint}
    )
    return WebhookSink(e, None, 4, lambda s: None, lambda o, r: None)  # type: ignore[arg-type]


def test_tables_operations_and_filters_choose_the_events() -> None:
    s = sink(tables=["public.ord*"], operations=["insert"],
             filter=[{"field": "new.status", "one_of": ["paid"]},
                     {"field": "new.note", "exists": False}])  # fmt: skip
    assert s.wants(item("insert", "orders", 1, 1, status="paid"))
    assert not s.wants(item("update", "orders", 1, 1, status="paid"))
    assert not s.wants(item("insert", "users", 1, 1, status="paid"))
    assert not s.wants(item("insert", "orders", 1, 1, status="new"))
    assert not s.wants(item("insert", "orders", 1, 1, status="paid", note="x"))
    events = sink(input="events", subscriptions=["order-*"])
    sub = Item(op="event", subscription="order-paid", body=b"{}")
    assert events.wants(sub)
    assert not events.wants(Item(op="event", subscription="user-new", body=b"{}"))


def test_conditions() -> None:
    doc = {"new": {"a": 1, "b": None, "c": {"d": "x"}}}
    assert holds(Condition(field="new.a", equals=1), doc)
    assert not holds(Condition(field="new.a", equals="1"), doc)
    assert holds(Condition(field="new.c.d", one_of=["x", "y"]), doc)
    assert holds(Condition(field="new.b", exists=False), doc)
    assert holds(Condition(field="new.zz", exists=False), doc)
    assert not holds(Condition(field="new.zz", equals=None), doc)  # absent is not null
    with pytest.raises(ValueError, match="exactly one"):
        Condition(field="new.a", equals=1, exists=True)


def test_lanes_keep_each_keys_order_and_batches_have_stable_ids() -> None:
    s = sink(batch_size=3)
    items = [item("insert", "t", row % 5, lsn) for lsn, row in enumerate(range(40))]
    lanes = s.split(items)
    for lane in lanes:
        assert all(len(d.origins) <= 3 for d in lane)
    order: dict[int, list[int]] = {}
    for lane in lanes:
        for d in lane:
            for element in orjson.loads(d.body):
                ev = element["event"]
                assert element["webhook_id"] == f"wc_{ev['lsn']}"  # each event's own id
                order.setdefault(ev["key"]["id"], []).append(ev["lsn"])
    assert all(v == sorted(v) for v in order.values())
    assert sum(len(v) for v in order.values()) == 40
    for row in range(5):  # a key lives in one lane
        assert sum(any(f'"id":{row}}}'.encode() in d.body for d in lane) for lane in lanes) == 1
    again = s.split(items)
    assert [[d.msg_id for d in lane] for lane in lanes] == [
        [d.msg_id for d in lane] for lane in again
    ]
    single = as_delivery([items[0]])
    assert single.msg_id == "wc_0"
    assert single.body == items[0].body


def test_settings_refuse_what_cannot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="signing secret"):
        load_settings(Kafka2WebhookSettings, endpoints=[{"name": "a", "url": "http://h/"}])
    monkeypatch.setenv("KAFKA2WEBHOOK_SECRETS__A", "from-the-environment-123")
    s = load_settings(Kafka2WebhookSettings, endpoints=[{"name": "a", "url": "http://h/"}])
    assert s.secret_of(s.endpoints[0]) == b"from-the-environment-123"
    assert "from-the-environment" not in str(s.effective())
    monkeypatch.delenv("KAFKA2WEBHOOK_SECRETS__A")
    bad: list[tuple[dict[str, Any], str]] = [
        ({"endpoints": [{"name": "A b", "url": "http://h/", "secret": "x" * 16}]}, "endpoint name"),
        ({"endpoints": [{"name": "a", "url": "ftp://h/", "secret": "x" * 16}]}, "http"),
        ({"endpoints": [{"name": "a", "url": "http://h/", "secret": "x" * 16},
                        {"name": "a", "url": "http://h/", "secret": "x" * 16}]}, "unique"),
        ({"endpoints": [{"name": "a", "url": "http://h/", "secret": "x" * 16,
                         "headers": {"Webhook-Id": "x"}}]}, "set by kafka2webhook"),
        ({"batch": {"concurrency": 2}}, "batch.concurrency"),
        ({"secrets": {"nobody": "x" * 16}}, "do not exist"),
    ]  # fmt: skip
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            load_settings(Kafka2WebhookSettings, **overrides)


def test_a_service_keeps_its_port_when_another_http_key_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a default instance (HttpSettings(port=9190)) was replaced by one built from the
    # class defaults: port 9187, pg2kafka's
    from services.kafka2webhook.settings import Kafka2WebhookSettings

    monkeypatch.setenv("KAFKA2WEBHOOK_HTTP__HOST", "127.0.0.2")
    assert Kafka2WebhookSettings().http.port == 9190
