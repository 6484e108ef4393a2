"""One HTTP attempt with an overall deadline, against a receiver that may be hostile.

A socket timeout bounds one read, not an answer: a receiver that trickles a byte every
few seconds (in its status line, its headers or its body) would hold a lane forever. So
each attempt has a deadline (``delivery.timeout_s``) covering all of it: connecting, the
TLS handshake, sending, the status line, the headers and the body. A :class:`Watchdog`
thread (one per endpoint) shuts down the sockets of an attempt once its deadline passed;
the lane's blocked read or write then fails at once and :func:`exchange` reports "no
complete answer within ... s" (a retriable failure). The connections the pool hands out
register their sockets with the attempt of the thread using them
(:func:`deadline_pool`).

:func:`exchange` never raises: it returns an :class:`Answer` (the status, the headers
the caller reads, the start of the body, whether the answer ended) or, when no answer
came, the reason. A body is read at most :data:`BODY_LIMIT` bytes, never decompressed; a
connection whose answer was not read to its end is closed, not reused.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from services.kafka2webhook.untrusted import EXCERPT, clean

BODY_LIMIT = 64 * 1024
"""Bytes of an answer's body read at most (the rest is not read: the connection is
closed); its first ``EXCERPT * 4`` are kept for the dead letter's reason."""

_current = threading.local()  # the Attempt of the lane thread, while it runs


@dataclass(eq=False)
class Attempt:
    """One attempt's deadline (``time.monotonic``) and the sockets it uses."""

    deadline: float
    expired: bool = False
    sockets: list[socket.socket] = field(default_factory=list)
    connections: list[HTTPConnection] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def watch_socket(self, sock: socket.socket) -> None:
        """A new connection's socket (before its TLS handshake): watched through a
        duplicate, which stays valid when the TLS layer takes the original over."""
        try:
            dup = sock.dup()
        except OSError:
            return
        with self.lock:
            self.sockets.append(dup)
            if self.expired:
                _shutdown(dup)

    def watch_connection(self, conn: HTTPConnection) -> None:
        """A connection about to send: its current socket is shut down at the deadline."""
        with self.lock:
            self.connections.append(conn)
            if self.expired:
                _shutdown(conn.sock)

    def cut(self) -> None:
        """The deadline passed: every socket of the attempt is shut down (the blocked
        read or write fails at once)."""
        with self.lock:
            self.expired = True
            for sock in self.sockets:
                _shutdown(sock)
            for conn in self.connections:
                _shutdown(conn.sock)

    def release(self) -> None:
        with self.lock:
            sockets, self.sockets, self.connections = self.sockets, [], []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()


def _shutdown(sock: Any) -> None:
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            # The socket's own call, also for an SSLSocket (whose shutdown would drop its
            # TLS state under the reading thread's feet).
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class Watchdog:
    """Cuts the attempts of one endpoint that run past their deadline (its thread starts
    with the first attempt, and ends with :meth:`close`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._attempts: set[Attempt] = set()
        self._closed = False
        self._thread: threading.Thread | None = None

    def begin(self, seconds: float) -> Attempt:
        """An attempt of the calling thread, due in ``seconds``; :meth:`end` it."""
        attempt = Attempt(time.monotonic() + seconds)
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name=f"webhook-{self.name}-deadline", daemon=True
                )
                self._thread.start()
            self._attempts.add(attempt)
            self._cond.notify()
        _current.attempt = attempt
        return attempt

    def end(self, attempt: Attempt) -> None:
        _current.attempt = None
        with self._cond:
            self._attempts.discard(attempt)
        attempt.release()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                due = [a for a in self._attempts if a.deadline <= now]
                for attempt in due:
                    self._attempts.discard(attempt)
                    attempt.cut()
                nearest = min((a.deadline for a in self._attempts), default=None)
                self._cond.wait(None if nearest is None else max(0.0, nearest - now))


def _attempt() -> Attempt | None:
    attempt: Attempt | None = getattr(_current, "attempt", None)
    return attempt


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        attempt = _attempt()
        if attempt is not None:
            attempt.watch_socket(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        attempt = _attempt()
        if attempt is not None:
            attempt.watch_connection(self)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        attempt = _attempt()
        if attempt is not None:
            attempt.watch_socket(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        attempt = _attempt()
        if attempt is not None:
            attempt.watch_connection(self)
        super().request(*args, **kwargs)


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


def deadline_pool(maxsize: int) -> urllib3.PoolManager:
    """A connection pool whose connections the :class:`Watchdog` can cut (``maxsize``
    kept-alive connections per receiver: one per lane)."""
    pool = urllib3.PoolManager(num_pools=4, maxsize=maxsize, block=True)
    pool.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    return pool


@dataclass(frozen=True, slots=True)
class Answer:
    """What a receiver answered: the status, the headers kept (``Retry-After``,
    ``Location``), the first bytes of the body, and whether the answer ended (its body
    read to the end, or :data:`BODY_LIMIT` of it) within the deadline."""

    status: int
    retry_after: str | None = None
    location: str | None = None
    body: bytes = b""
    ended: bool = True


def exchange(
    pool: urllib3.PoolManager,
    watchdog: Watchdog,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
) -> Answer | str:
    """One POST within ``timeout_s`` overall: the answer, or why none came (a retriable
    failure). Never raises."""
    attempt = watchdog.begin(timeout_s)
    try:
        try:
            resp = pool.request(
                "POST", url, body=body, headers=headers,
                timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s), retries=False,
                redirect=False, preload_content=False, decode_content=False,
                pool_timeout=timeout_s,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - whatever the receiver made the client raise
            return _no_answer(attempt, timeout_s, exc)
        head, state = _read_body(resp)
        try:
            if state != "end":
                resp.close()  # the rest unread, or broken: the connection is not reused
            resp.release_conn()
            return Answer(
                int(resp.status),
                _header(resp, "retry-after"),
                _header(resp, "location"),
                head,
                state != "broken" and not attempt.expired,
            )
        except Exception as exc:  # noqa: BLE001 - whatever the receiver made the client raise
            return _no_answer(attempt, timeout_s, exc)
    finally:
        watchdog.end(attempt)


def _header(resp: Any, name: str) -> str | None:
    value = resp.headers.get(name)
    return value if isinstance(value, str) else None


def _read_body(resp: Any) -> tuple[bytes, str]:
    """The first bytes of the body, and how reading ended: ``end`` (the body ended),
    ``limit`` (:data:`BODY_LIMIT` read, the rest left unread) or ``broken`` (a broken or
    cut connection, a malformed body)."""
    head = b""
    read = 0
    try:
        while read < BODY_LIMIT:
            chunk = resp.read(min(16 * 1024, BODY_LIMIT - read), decode_content=False)
            if not chunk:
                return head, "end"
            read += len(chunk)
            if len(head) < EXCERPT * 4:
                head += chunk[: EXCERPT * 4 - len(head)]
    except Exception:  # noqa: BLE001 - whatever the receiver made the client raise
        return head, "broken"
    return head, "limit"


def _no_answer(attempt: Attempt, timeout_s: float, exc: BaseException) -> str:
    # Past the deadline, whichever noticed first: the watchdog cutting the sockets, or a
    # socket's own timeout (the same number of seconds, counted from a later start) when
    # a loaded machine ran the watchdog late (seen in CI: "no answer: ... timed out").
    if attempt.expired or time.monotonic() >= attempt.deadline:
        return f"no complete answer within {timeout_s:g} s (delivery.timeout_s)"
    return clean(f"no answer: {type(exc).__name__}: {exc}", EXCERPT)
