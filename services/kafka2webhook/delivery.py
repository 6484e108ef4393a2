"""Delivering events to one endpoint: signed POSTs, retries, per-key order.

:class:`Deliverer` takes a batch of :class:`Delivery` items (each one event, or with
``batch_size`` > 1 up to that many events of one lane as a JSON array) and returns once
each was delivered (a 2xx answer) or given up on (the caller dead-letters those). Order:
events are spread over ``delivery.parallel_keys`` lanes by their Kafka key; a lane
delivers its items one after another, so a key's next event waits for the previous one's
outcome, while the other lanes go on. What is retried (connection failures, timeouts,
408, 425, 429, 5xx) waits with exponential backoff and jitter, or as long as the answer's
``Retry-After`` says (within ``max_backoff_s``), until the event's retry budget
(``give_up_after_s``, ``max_attempts``) is spent; any other answer (410 Gone, 400, a
redirect...) is given up on at once. Stopping while waiting raises RetriableError: the
batch is not committed and is delivered again after the restart (receivers de-duplicate
by ``webhook-id``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import urllib3
from prometheus_client import Counter, Gauge, Histogram

from services.kafka2webhook import signing
from services.kafka2webhook.client import Answer, Watchdog, deadline_pool, exchange
from services.kafka2webhook.settings import DeliverySettings, EndpointSettings
from services.kafka2webhook.untrusted import clean, excerpt, header_value_ok, retry_after_s
from shared.errors import RetriableError, Verdict, http_status_verdict
from shared.interfaces import Origin, Rejection

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One POST: its idempotency key, body, and the records it covers."""

    msg_id: str
    body: bytes
    origins: tuple[Origin, ...]
    events: int = 1


@dataclass
class EndpointState:
    """What ``status`` and the metrics show of an endpoint, updated by its deliveries."""

    delivered: int = 0
    dead_lettered: int = 0
    failing_since: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> dict[str, object]:
        with self.lock:
            return {
                "delivered": self.delivered,
                "dead_lettered": self.dead_lettered,
                "failing": self.failing_since is not None,
                "failing_for_s": None
                if self.failing_since is None
                else round(time.time() - self.failing_since, 1),
                "last_error": self.last_error,
                "last_error_at": self.last_error_at,
            }


class DeliveryMetrics:
    """Per-endpoint delivery metrics (``walcast_kafka2webhook_*``), labelled ``webhook``
    with the endpoint's name (not ``endpoint``: the Prometheus Operator sets that label on
    every scraped series)."""

    def __init__(self, registry: object, prefix: str = "walcast_kafka2webhook") -> None:
        kw = {"registry": registry}
        self.deliveries = Counter(
            f"{prefix}_deliveries", "events by outcome: delivered (2xx) or dead_lettered",
            ["webhook", "outcome"], **kw,  # type: ignore[arg-type]
        )  # fmt: skip
        self.attempts = Counter(
            f"{prefix}_attempts", "HTTP attempts by result: ok, retry (will be tried again),"
            " refused (given up on)", ["webhook", "result"], **kw,  # type: ignore[arg-type]
        )  # fmt: skip
        self.seconds = Histogram(
            f"{prefix}_request_seconds", "one HTTP attempt, request to answer", ["webhook"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), **kw,  # type: ignore[arg-type]
        )  # fmt: skip
        self.failing = Gauge(
            f"{prefix}_failing", "1 while the endpoint's last attempt failed",
            ["webhook"], **kw,  # type: ignore[arg-type]
        )  # fmt: skip


def verdict(status: int) -> Verdict:
    """An endpoint's answer: 2xx delivered (never asked); 408 and 425 are retried as the
    engines' 429 and 5xx are (:func:`shared.errors.http_status_verdict`); the rest of
    4xx, and 3xx (redirects are not followed: the URL should be updated), are final. A
    status no final answer has (1xx, 600 and above) is retried as a broken answer is."""
    if status < 200 or status > 599:
        return Verdict.RETRIABLE
    if 300 <= status < 400:
        return Verdict.PERMANENT
    return http_status_verdict(status)


def judge(answer: Answer | str, now: float) -> tuple[float | None, str | None]:
    """What one attempt's result means (never raises, whatever the receiver sent):
    (None, None) delivered; (seconds to wait, 0 for the backoff; reason) to retry;
    (None, reason) refused for good. ``answer`` is the receiver's answer, or why none
    came (:func:`services.kafka2webhook.client.exchange`). A 2xx counts once its answer
    ended within the deadline; the reason carries the status and a cleaned excerpt of
    the body (:func:`services.kafka2webhook.untrusted.excerpt`)."""
    if isinstance(answer, str):
        return 0.0, answer
    status = answer.status
    if 200 <= status < 300:
        if answer.ended:
            return None, None
        return 0.0, f"HTTP {status}, but the answer did not end within delivery.timeout_s"
    text = excerpt(answer.body)
    reason = f"HTTP {status}: {text}" if text else f"HTTP {status}"
    if verdict(status) is Verdict.PERMANENT:
        if 300 <= status < 400:
            where = clean(answer.location or "nowhere", 200)
            reason += f" (redirect to {where}: update the endpoint's url)"
        return None, reason
    after = retry_after_s(answer.retry_after, now)
    return (after if after is not None else 0.0), reason


class Deliverer:
    """One endpoint's deliveries (see the module doc). ``sleep`` waits between attempts
    and raises RetriableError when the service stops."""

    def __init__(
        self,
        endpoint: EndpointSettings,
        secret: bytes,
        delivery: DeliverySettings,
        metrics: DeliveryMetrics,
        state: EndpointState,
        pool: urllib3.PoolManager | None = None,
        clock: Callable[[], float] = time.time,
        stop: threading.Event | None = None,
    ) -> None:
        self.endpoint = endpoint
        # Set when the service stops: lanes deliver no further item of the batch (it is
        # not committed, and is delivered again, with the same ids, after the restart).
        self.stop = stop or threading.Event()
        self.secret = secret
        self.d = delivery
        self.state = state
        self.clock = clock
        self.pool = pool or deadline_pool(delivery.parallel_keys)
        # Cuts an attempt at its deadline (delivery.timeout_s): a receiver trickling its
        # answer holds a lane that long at most, and a stop waits that long at most.
        self.watchdog = Watchdog(endpoint.name)
        self.lanes = ThreadPoolExecutor(delivery.parallel_keys, f"webhook-{endpoint.name}")
        name = endpoint.name
        self.m_ok = metrics.deliveries.labels(name, "delivered")
        self.m_dead = metrics.deliveries.labels(name, "dead_lettered")
        self.m_attempt = {r: metrics.attempts.labels(name, r) for r in ("ok", "retry", "refused")}
        self.m_seconds = metrics.seconds.labels(name)
        self.m_failing = metrics.failing.labels(name)
        self.headers = {"content-type": "application/json", **endpoint.headers}

    def close(self) -> None:
        """After the loop ended: waits for the lanes (each within its attempt's deadline)."""
        self.lanes.shutdown(wait=True)
        self.pool.clear()
        self.watchdog.close()

    def deliver(
        self, lanes: Sequence[Sequence[Delivery]], sleep: Callable[[float], object]
    ) -> list[Rejection]:
        """Every lane's deliveries, lanes at once; the records given up on, with why."""
        futures = [self.lanes.submit(self._lane, lane, sleep) for lane in lanes if lane]
        rejected: list[Rejection] = []
        failure: BaseException | None = None
        for f in futures:  # every lane ends (a stop ends them all) before this returns
            try:
                rejected.extend(f.result())
            except BaseException as exc:  # noqa: BLE001 - the first is raised below
                failure = failure or exc
        if failure is not None:
            raise failure
        return rejected

    def _lane(self, items: Sequence[Delivery], sleep: Callable[[float], object]) -> list[Rejection]:
        out: list[Rejection] = []
        for item in items:
            if self.stop.is_set():
                raise RetriableError(
                    "stopping: the rest of the batch is delivered after the restart"
                )
            reason = self.post(item, sleep)
            if reason is None:
                self.m_ok.inc(item.events)
                with self.state.lock:
                    self.state.delivered += item.events
            else:
                self.m_dead.inc(item.events)
                with self.state.lock:
                    self.state.dead_lettered += item.events
                out.extend((o, reason) for o in item.origins)
        return out

    def post(self, item: Delivery, sleep: Callable[[float], object]) -> str | None:
        """Attempts until delivered (None) or given up on (the reason, with the last
        status and an excerpt of the answer)."""
        started = self.clock()
        delay = self.d.initial_backoff_s
        attempt = 0
        while True:
            attempt += 1
            wait, reason = self._attempt(item)
            if reason is None:
                return None
            if wait is None:  # refused for good
                return f"HTTP refused by {self.endpoint.name}: {reason}"
            spent = self.clock() - started
            exhausted = self.d.max_attempts and attempt >= self.d.max_attempts
            pause = wait if wait > 0 else _jittered(delay, self.d.jitter)
            pause = min(pause, self.d.max_backoff_s)
            if exhausted or spent + pause > self.d.give_up_after_s:
                return (
                    f"gave up on {self.endpoint.name} after {attempt} attempt(s) in"
                    f" {spent:.0f} s: {reason}"
                )
            sleep(pause)
            delay = min(delay * 2, self.d.max_backoff_s)

    def _attempt(self, item: Delivery) -> tuple[float | None, str | None]:
        """One POST within ``delivery.timeout_s``: (None, None) delivered; (seconds to
        wait or 0 for the backoff, reason) to retry; (None, reason) refused for good."""
        if not header_value_ok(item.msg_id):  # app.py never makes one: refused, not sent
            self.m_attempt["refused"].inc()
            return None, f"the webhook-id {clean(item.msg_id, 200)!r} is not a header value"
        headers = {**self.headers, **signing.headers(self.secret, item.msg_id, item.body)}
        began = time.monotonic()
        answer = exchange(self.pool, self.watchdog, self.endpoint.url, item.body, headers,
                          self.d.timeout_s)  # fmt: skip
        self.m_seconds.observe(time.monotonic() - began)
        wait, reason = judge(answer, self.clock())
        if reason is None:
            self.m_attempt["ok"].inc()
            if self.state.failing_since is not None:
                with self.state.lock:
                    self.state.failing_since = None
                self.m_failing.set(0)
            return None, None
        self._failed(reason)
        self.m_attempt["refused" if wait is None else "retry"].inc()
        return wait, reason

    def _failed(self, reason: str) -> None:
        now = self.clock()
        with self.state.lock:
            if self.state.failing_since is None:
                self.state.failing_since = now
            self.state.last_error = reason
            self.state.last_error_at = now
        self.m_failing.set(1)


def _jittered(base: float, jitter: float) -> float:
    spread = base * jitter
    return max(0.0, base + random.uniform(-spread, spread))  # noqa: S311 - jitter only


def stopping(stop: threading.Event) -> Callable[[float], None]:
    """A sleep that raises RetriableError once ``stop`` is set."""

    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise RetriableError("stopping while waiting to deliver again")

    return sleep
