"""A webhook receiver in the test process: a real HTTP server on 127.0.0.1 that verifies
each request's signature (the Standard Webhooks check receivers run), records what it
received, and answers as a test scripts it (a status per request, ``Retry-After``, or
being down: its port closed, then served again on the same port)."""

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


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered
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
