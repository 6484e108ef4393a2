"""A webhook receiver in the test process: a real HTTP server on 127.0.0.1 that verifies
each request's signature (the Standard Webhooks check receivers run), records what it
received, and answers as a test scripts it (a status per request, ``Retry-After``, or
being down: its port closed, then served again on the same port) — or as a hostile
receiver would (:data:`HOSTILE`: a huge ``Retry-After`` date, an answer trickled a byte
at a time, headers the client refuses). :class:`RawServer` answers raw bytes (what no
HTTP server library would write) for the unit and fuzz tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from services.kafka2webhook.signing import SignatureError, verify

HUGE_RETRY_AFTER = "Mon, 1 Jan 99999999999 00:00:00 GMT"
TRICKLE_EVERY_S = 0.2  # well under any read timeout: only a deadline ends the answer
TRICKLE_FOR_S = 120.0  # then the receiver gives up itself (a test failed by then)

HOSTILE = ("huge-retry-after", "trickle-body", "trickle-headers", "two-lengths")
"""What a hostile receiver answers, by name: a 503 with ``Retry-After`` in the year
99999999999; a 200 whose body never ends (a byte every TRICKLE_EVERY_S); a status line
whose headers never end (likewise); a 503 with two different Content-Length values."""


def trickle(conn: socket.socket, head: bytes) -> None:
    """``head``, then a byte every TRICKLE_EVERY_S until the client hangs up."""
    conn.sendall(head)
    end = time.monotonic() + TRICKLE_FOR_S
    while time.monotonic() < end:
        time.sleep(TRICKLE_EVERY_S)
        try:
            conn.sendall(b" " if head.endswith(b"\r\n\r\n") else b"X")
        except OSError:
            return


def answer_hostile(conn: socket.socket, behaviour: str) -> None:
    """Write the raw answer named ``behaviour`` (:data:`HOSTILE`) on ``conn``."""
    if behaviour == "huge-retry-after":
        conn.sendall(
            b"HTTP/1.1 503 Busy\r\nRetry-After: " + HUGE_RETRY_AFTER.encode()
            + b"\r\nContent-Length: 2\r\n\r\n{}"
        )  # fmt: skip
    elif behaviour == "trickle-body":
        trickle(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n{")
    elif behaviour == "trickle-headers":
        trickle(conn, b"HTTP/1.1 200 OK\r\nX-Slow: ")
    elif behaviour == "two-lengths":
        conn.sendall(b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}")
    else:
        raise ValueError(f"no hostile behaviour {behaviour!r}")


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered (0: a hostile answer, HOSTILE)
    signature_ok: bool
    at: float

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Receiver:
    secret: bytes
    # per path: statuses (with optional Retry-After) to answer in turn; then 200
    script: dict[str, list[tuple[int, str | None]]] = field(default_factory=dict)
    # per path: hostile answers (HOSTILE) given first, in turn; "trickle-body" alone
    # repeats forever when it is the last (a receiver that never answers whole)
    hostile: dict[str, list[str]] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    # called per request before answering (a slow receiver sleeps here)
    delay: Callable[[str], float] = lambda _path: 0.0
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _connections: set[socket.socket] = field(default_factory=set)

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with receiver.lock:
                    receiver._connections.add(self.connection)

            def finish(self) -> None:
                with receiver.lock:
                    receiver._connections.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    verify(receiver.secret, headers, body)
                    ok = True
                except SignatureError:
                    ok = False
                pause = receiver.delay(self.path)
                if pause:
                    time.sleep(pause)
                with receiver.lock:
                    bad = receiver.hostile.get(self.path, [])
                    behaviour = bad[0] if bad else None
                    if bad and not (len(bad) == 1 and bad[0] == "trickle-body"):
                        bad.pop(0)
                    if behaviour is not None:
                        receiver.received.append(
                            Received(self.path, headers, body, 0, ok, time.monotonic())
                        )
                if behaviour is not None:
                    self.close_connection = True
                    answer_hostile(self.connection, behaviour)
                    return
                with receiver.lock:
                    queue = receiver.script.get(self.path, [])
                    status, retry_after = queue.pop(0) if queue else (200, None)
                    if not ok:
                        status = 401
                    receiver.received.append(
                        Received(self.path, headers, body, status, ok, time.monotonic())
                    )
                answer = b'{"error": "scripted"}' if status >= 300 else b"{}"
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Down: the port is closed (new connections are refused) and the kept-alive ones
        are cut, until ``start`` again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:
            open_now, self._connections = list(self._connections), set()
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def delivered(self, path: str = "/hook") -> list[Received]:
        """What was answered 2xx on ``path``, in arrival order."""
        with self.lock:
            return [r for r in self.received if r.path == path and 200 <= r.status < 300]

    def wait_for(
        self, condition: Callable[[], bool], what: str, timeout: float = 60,
        progress: Callable[[], object] | None = None,
    ) -> None:  # fmt: skip
        """Until ``condition`` holds; the deadline moves while ``progress`` changes (a loaded
        machine delivers slowly, not never). Fails with what arrived."""
        deadline = time.monotonic() + timeout
        seen = progress() if progress else None
        while not condition():
            now = progress() if progress else None
            if now != seen:
                seen, deadline = now, time.monotonic() + timeout
            if time.monotonic() > deadline:
                with self.lock:
                    tail = [(r.path, r.status) for r in self.received[-10:]]
                raise AssertionError(
                    f"{what}: not within {timeout}s; {len(self.received)} requests, the last {tail}"
                )
            time.sleep(0.05)


class RawServer:
    """A TCP server on 127.0.0.1 that reads each request (headers and Content-Length
    body) and answers with what ``answer(connection)`` writes, then closes the
    connection. Tests set ``answer`` between requests."""

    def __init__(self, answer: Callable[[socket.socket], None] | None = None) -> None:
        self.answer = answer or (
            lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        )
        self.requests: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                while len(rest) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    rest += chunk
                self.requests.append(head)
                self.answer(conn)
            except OSError:
                return

    def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._sock.close()
