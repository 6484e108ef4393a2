"""Properties of everything a webhook receiver or a record controls in kafka2webhook,
for hypothesis: the short run in tests/unit/kafka2webhook/test_fuzz_receiver.py, the long
one in bench/fuzz.py.

Each :class:`Target` is a name, a strategy and a ``check(example)`` that raises
AssertionError when the property does not hold (any other exception is a finding too):

- ``webhook.retry_after``: any ``Retry-After`` text is read as None or a finite wait
  between 0 and the cap, never an exception;
- ``webhook.judge``: any answer (status, ``Retry-After``, ``Location``, body bytes,
  whether it ended) is judged delivered, retried after a finite wait, or refused, with a
  printable reason of bounded length (a dead letter's header, a log line);
- ``webhook.event_ident``: any id headers and payload give a ``webhook-id`` that is a
  valid header value and the same every time, or a dead letter (EventDecodeError);
- ``webhook.exchange``: any raw bytes a receiver answers with, over a real socket, end
  in an answer or a reason within the attempt's deadline, never an exception.

bench/fuzz.py runs a target as::

    from hypothesis import given, settings
    for t in TARGETS:
        settings(max_examples=n, deadline=None)(given(t.strategy)(t.check))()
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from services.kafka2webhook.app import event_ident
from services.kafka2webhook.client import Answer, Watchdog, deadline_pool, exchange
from services.kafka2webhook.delivery import judge
from services.kafka2webhook.untrusted import RETRY_AFTER_CAP_S, header_value_ok, retry_after_s
from shared.contract.event import EventDecodeError
from tests.webhook_receiver import RawServer


@dataclass(frozen=True)
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], None]


NOW = 1_700_000_000.0

_http_dates = st.builds(
    lambda day, d, mon, y, h, m, s, tz: f"{day}, {d} {mon} {y} {h}:{m}:{s} {tz}",
    st.sampled_from(["Mon", "Tue", "Sun", "Xyz", ""]),
    st.integers(-5, 40),
    st.sampled_from(["Jan", "Feb", "Dec", "Foo"]),
    st.one_of(st.integers(-10, 10_000), st.integers(10**4, 10**15)),
    st.integers(-1, 99),
    st.integers(-1, 99),
    st.integers(-1, 99),
    st.sampled_from(["GMT", "+0000", "-2359", "+99999999999", "UT", "EST", "Z"]),
)
retry_after_values = st.one_of(
    st.none(),
    st.text(max_size=80),
    st.text(alphabet="0123456789 -+.eE", max_size=30),
    st.from_regex(r"[0-9]{1,5000}", fullmatch=True),
    _http_dates,
)


def check_retry_after(value: str | None) -> None:
    got = retry_after_s(value, NOW)
    assert got is None or (math.isfinite(got) and 0.0 <= got <= RETRY_AFTER_CAP_S), got


answers = st.builds(
    Answer,
    status=st.integers(0, 1200),
    retry_after=retry_after_values,
    location=st.one_of(st.none(), st.text(max_size=300)),
    body=st.binary(max_size=3000),
    ended=st.booleans(),
)


def check_judge(answer: Answer) -> None:
    wait, reason = judge(answer, NOW)
    if reason is None:
        assert wait is None
        assert 200 <= answer.status < 300
        assert answer.ended
        return
    assert wait is None or (math.isfinite(wait) and 0.0 <= wait <= RETRY_AFTER_CAP_S)
    assert reason.isprintable(), reason
    assert len(reason) <= 800


id_headers = st.one_of(
    st.binary(max_size=140),
    st.from_regex(r"[0-9]{1,20}", fullmatch=True).map(str.encode),
    st.sampled_from([b"", b"1\r\nX-Evil: 1", b"\xff", b"12 34", "é".encode()]),
)
events = st.tuples(
    st.dictionaries(
        st.sampled_from(["walcast-event-id", "walcast-stream-id", "other"]), id_headers
    ),
    st.binary(max_size=200),
)


def check_event_ident(example: tuple[dict[str, bytes], bytes]) -> None:
    headers, value = example
    try:
        ident = event_ident(headers, value)
    except EventDecodeError as exc:
        if not str(exc).isprintable():
            raise AssertionError(f"a reason that is not printable: {exc!r}") from None
        return
    assert header_value_ok(ident), ident
    assert ident == event_ident(dict(headers), bytes(value))  # the same event, the same id


class _Exchange:
    """One raw server and deliverer pieces, made on first use, for every example."""

    timeout_s = 0.5

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.server: RawServer | None = None
        self.watchdog = Watchdog("fuzz")
        self.pool = deadline_pool(1)

    def __call__(self, raw: bytes) -> None:
        with self.lock:
            if self.server is None:
                self.server = RawServer()
            self.server.answer = lambda conn: conn.sendall(raw)
            began = time.monotonic()
            got = exchange(self.pool, self.watchdog, self.server.url(), b"{}",
                           {"webhook-id": "wc_1"}, self.timeout_s)  # fmt: skip
            took = time.monotonic() - began
        assert took < self.timeout_s + 5.0, took  # the deadline, plus a loaded machine's slack
        if isinstance(got, str):
            assert got.isprintable(), got
        else:
            check_judge(got)


_exchange = _Exchange()


def check_exchange(raw: bytes) -> None:
    _exchange(raw)


_status_lines = st.builds(
    lambda v, code, reason: f"{v} {code} {reason}\r\n".encode("latin-1", "replace"),
    st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "ICY", ""]),
    st.one_of(st.integers(-10, 1200), st.text(max_size=5)),
    st.text(max_size=20),
)
_header_lines = st.lists(
    st.one_of(
        st.sampled_from(
            [
                b"Content-Length: 2",
                b"Content-Length: -1",
                b"Content-Length: 1, 2",
                b"Content-Length: abc",
                b"Transfer-Encoding: chunked",
                b"Content-Encoding: gzip",
                b"Retry-After: Mon, 1 Jan 99999999999 00:00:00 GMT",
                b"Retry-After: \xff\xfe",
                b"Location: \x1b[31m",
                b"no colon here",
                b"Connection: close",
            ]
        ),
        st.binary(max_size=60),
    ),
    max_size=8,
)
raw_answers = st.one_of(
    st.binary(max_size=400),
    st.builds(
        lambda status, headers, body: (
            status + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body
        ),
        _status_lines,
        _header_lines,
        st.binary(max_size=200),
    ),
)

TARGETS = [
    Target("webhook.retry_after", retry_after_values, check_retry_after),
    Target("webhook.judge", answers, check_judge),
    Target("webhook.event_ident", events, check_event_ident),
    Target("webhook.exchange", raw_answers, check_exchange),
]
"""Every property of this module, for bench/fuzz.py's list of targets."""
