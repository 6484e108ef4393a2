"""kafka2search's engine TLS and authentication options, for real, against both engines.

The local stack runs OpenSearch from the codelibs "cluster runner" artifacts (open-source
modules only: no security plugin) and Elasticsearch 8 with security off, so the engines
themselves speak plain HTTP and accept anyone. To exercise ``EngineSettings``' TLS and
credential options through the real clients (``engines._client_options`` ->
opensearch-py / elasticsearch-py -> urllib3 -> ssl) each test starts a TLS-terminating,
credential-checking reverse proxy on 127.0.0.1 in a thread, in front of the real engine.
The proxy counts what it authenticated and forwarded, so no test can pass by bypassing it.

A throwaway PKI is generated with the ``openssl`` CLI (``cryptography`` is not in the
venv): a CA, a server certificate for IP 127.0.0.1 and a client certificate signed by
it, and a second, unrelated "rogue" CA.

Covered, on OpenSearch and Elasticsearch unless noted:

* username/password over TLS verified against ``ca_certs``: create_index / bulk /
  refresh / count / mget round trip;
* ``api_key`` (Elasticsearch only: the OpenSearch client has no API keys), in both the
  "id:key" and the encoded form;
* mutual TLS with ``client_cert`` / ``client_key`` when the proxy requires a client
  certificate, and the refusal without one;
* ``verify_certs: false`` accepts a certificate no configured CA signed;
* a wrong password (or API key) -> HTTP 401, classified PERMANENT, with the operator hint;
* ``ca_certs`` naming a CA that did not sign the server certificate -> an SSL error
  naming the verification failure, classified PERMANENT with a hint naming ``ca_certs``
  (retrying a misconfiguration would loop forever under kafka2search's never-give-up
  retry policy).
"""

from __future__ import annotations

import base64
import binascii
import http.client
import importlib
import secrets
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from services.kafka2search.engines import SearchEngine, Stored, dumps, engine_for
from services.kafka2search.settings import EngineSettings, IndexSettings
from shared.errors import Verdict, classify, operator_hint
from tests.integration.kafka2search.conftest import search_settings

USER, PASSWORD = "walcast", "s3cret-pass"
KEY_ID, KEY_SECRET = "walcast-key-id", "walcast-key-secret"
CLIENT_CN = "walcast-test-client"
CREDENTIALS_HINT = "check the search engine credentials (username / password or API key)"

# -- a throwaway PKI ------------------------------------------------------------------

_REQ_CONFIG = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def sources(docs: dict[str, Stored]) -> dict[str, dict[str, Any]]:
    return {i: d.source for i, d in docs.items()}


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca_cert: Path  # a CA that signed nothing used here


def _openssl(cwd: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr}")


def _new_ca(d: Path, name: str) -> None:
    _openssl(d, "req", "-x509", "-new", "-config", "openssl.cnf", "-extensions", "ca",
             "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
             "-subj", f"/CN=walcast test {name}")  # fmt: skip


def _new_leaf(d: Path, name: str, cn: str, ca: str) -> None:
    _openssl(d, "req", "-new", "-config", "openssl.cnf",
             "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")  # fmt: skip
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2",
             "-extfile", "openssl.cnf", "-extensions", name, "-out", f"{name}.crt")  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    (d / "openssl.cnf").write_text(_REQ_CONFIG)
    _new_ca(d, "ca")
    _new_ca(d, "rogue")
    _new_leaf(d, "server", "127.0.0.1", "ca")
    _new_leaf(d, "client", CLIENT_CN, "ca")
    return Pki(
        ca_cert=d / "ca.crt",
        server_cert=d / "server.crt",
        server_key=d / "server.key",
        client_cert=d / "client.crt",
        client_key=d / "client.key",
        rogue_ca_cert=d / "rogue.crt",
    )


# -- the TLS-terminating, credential-checking reverse proxy ---------------------------

# RFC 9110 7.6.1 plus the framing headers this proxy recomputes.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
     "trailer", "trailers", "transfer-encoding", "upgrade", "content-length"}
)  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """One HTTP request the proxy read (after a successful TLS handshake)."""

    method: str
    path: str
    principal: str | None  # "user:<name>" / "api_key:<id>"; None when refused (401)
    client_cn: str | None  # the verified client certificate's CN, when one was required


@dataclass
class AuthProxy:
    upstream: str
    context: ssl.SSLContext
    users: dict[str, str]
    api_keys: dict[str, str]
    requests: list[Seen] = field(default_factory=list)
    handshake_failures: list[BaseException] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> AuthProxy:
        server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)  # bound and listening here
        server.proxy = self
        self.server = server
        self.thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.thread is not None:
            self.thread.join(10)

    def authenticate(self, header: str | None) -> str | None:
        scheme, _, value = (header or "").partition(" ")
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        name, sep, secret = decoded.partition(":")
        if not sep:
            return None
        if scheme.lower() == "basic" and name in self.users:
            return f"user:{name}" if secrets.compare_digest(self.users[name], secret) else None
        if scheme.lower() == "apikey" and name in self.api_keys:
            return (
                f"api_key:{name}" if secrets.compare_digest(self.api_keys[name], secret) else None
            )
        return None

    def record(self, item: Seen | BaseException) -> None:
        with self.changed:
            if isinstance(item, Seen):
                self.requests.append(item)
            else:
                self.handshake_failures.append(item)
            self.changed.notify_all()

    def wait_handshake_failure(self, timeout: float = 10) -> BaseException:
        """The first failed TLS handshake: the server side notices it on its own thread,
        possibly just after the client has raised."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.handshake_failures, timeout):
                pytest.fail(f"the proxy saw no failed TLS handshake within {timeout}s")
            return self.handshake_failures[0]

    def calls(self) -> list[tuple[str, str]]:
        """(method, path without query) of every request read, in order."""
        return [(s.method, s.path.partition("?")[0]) for s in self.requests]


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    proxy: AuthProxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ssl.SSLError | ConnectionError):
            self.proxy.record(exc)  # a refused handshake: expected by some tests
        else:
            super().handle_error(request, client_address)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients' pools expect
    timeout = 30
    server: _ProxyServer

    def setup(self) -> None:
        # The TLS handshake runs here, on the connection's own thread, not in accept().
        self.request = self.server.proxy.context.wrap_socket(self.request, server_side=True)
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while size := int(self.rfile.readline().split(b";")[0], 16):
                out += self.rfile.read(size)
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(out)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _client_cn(self) -> str | None:
        cert = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        for rdn in (cert or {}).get("subject", ()):
            for attribute in rdn:  # ((("commonName", "x"),), ...)
                if attribute[0] == "commonName":
                    return str(attribute[1])
        return None

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _proxy(self) -> None:
        proxy = self.server.proxy
        body = self._body()
        principal = proxy.authenticate(self.headers.get("Authorization"))
        proxy.record(Seen(self.command, self.path, principal, self._client_cn()))
        if principal is None:
            error = {
                "error": {
                    "type": "security_exception",
                    "reason": "test proxy: missing or wrong credentials",
                },
                "status": 401,
            }
            payload = orjson.dumps(error)
            self._send(
                401,
                [
                    ("Content-Type", "application/json; charset=UTF-8"),
                    ("WWW-Authenticate", 'Basic realm="walcast-test", ApiKey'),
                    ("Content-Length", str(len(payload))),
                ],
                payload,
            )
            return
        up = urlsplit(proxy.upstream)
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port or 80, timeout=60)
        try:
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in _HOP_BY_HOP | {"host", "authorization"}
            }
            conn.request(self.command, self.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            relayed = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP_BY_HOP]
            length = answer.getheader("Content-Length") if self.command == "HEAD" else None
            relayed.append(("Content-Length", length or str(len(data))))
            self._send(answer.status, relayed, data)
        finally:
            conn.close()

    def do_GET(self) -> None:
        self._proxy()

    def do_HEAD(self) -> None:
        self._proxy()

    def do_POST(self) -> None:
        self._proxy()

    def do_PUT(self) -> None:
        self._proxy()

    def do_DELETE(self) -> None:
        self._proxy()


ProxyFactory = Callable[..., AuthProxy]


@pytest.fixture
def upstream(stack_env: dict[str, str], engine_kind: str) -> str:
    """The engine's plain-HTTP URL."""
    return stack_env[
        "WALCAST_OPENSEARCH_URL" if engine_kind == "opensearch" else "WALCAST_ELASTICSEARCH_URL"
    ]


@pytest.fixture
def start_proxy(pki: Pki) -> Iterator[ProxyFactory]:
    """``start_proxy(upstream, require_client_cert=False)``: a running proxy (shut down
    after the test) accepting USER/PASSWORD and the API key KEY_ID/KEY_SECRET."""
    started: list[AuthProxy] = []

    def start(upstream_url: str, *, require_client_cert: bool = False) -> AuthProxy:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki.server_cert, pki.server_key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(pki.ca_cert)
        proxy = AuthProxy(upstream_url, context, {USER: PASSWORD}, {KEY_ID: KEY_SECRET})
        started.append(proxy)
        return proxy.start()

    yield start
    for proxy in started:
        proxy.close()


# -- engines and indices ----------------------------------------------------------------


@pytest.fixture
def make_engine(
    env_file: Path, stack_env: dict[str, str], unique_name: str
) -> Iterator[Callable[..., SearchEngine]]:
    """``make_engine(kind, proxy, **engine_settings)``: an engine built the way the service
    builds it (settings loaded with the stack's env file), pointed at the proxy."""
    made: list[SearchEngine] = []

    def make(kind: str, proxy: AuthProxy, **engine: Any) -> SearchEngine:
        settings = search_settings(
            env_file,
            stack_env,
            kind,
            unique_name,
            f"{unique_name}.unused",
            engine={"urls": [proxy.url], **engine},
        ).engine
        made.append(engine_for(settings))
        return made[-1]

    yield make
    for e in made:
        e.close()


@pytest.fixture
def alias(upstream: str, engine_kind: str, unique_name: str) -> Iterator[str]:
    """A unique alias name; the index behind it is removed afterwards, directly (not
    through the proxy), so cleanup works whatever the test did to the proxy."""
    name = unique_name.replace("_", "-")
    yield name
    direct = engine_for(EngineSettings(kind=engine_kind, urls=[upstream]))  # type: ignore[arg-type]
    try:
        direct.delete_index(f"{name}-v1")
    finally:
        direct.close()


def client_errors(kind: str) -> ModuleType:
    """The exception module of the engine's client."""
    return importlib.import_module(
        "opensearchpy.exceptions" if kind == "opensearch" else "elasticsearch.exceptions"
    )


ROUND_TRIP_CALLS = [
    ("PUT", "/{alias}-v1"),
    ("POST", "/_bulk"),
    ("POST", "/{alias}/_refresh"),
    ("GET", "/{alias}/_count"),
    ("POST", "/{alias}/_mget"),
]


def round_trip(engine: SearchEngine, alias: str) -> list[tuple[str, str]]:
    """Create ``<alias>-v1`` behind ``alias``, index three documents, read them back.
    Returns the (method, path) calls it made, for comparing with what the proxy saw."""
    properties = {"title": {"type": "keyword"}}
    assert engine.create_index(f"{alias}-v1", alias, IndexSettings(), properties, {"t": 1})
    docs = {str(i): {"title": f"d{i}"} for i in range(3)}
    ndjson = b"".join(
        dumps({"index": {"_index": alias, "_id": i}}) + b"\n" + dumps(doc) + b"\n"
        for i, doc in docs.items()
    )
    assert engine.bulk(ndjson) is None  # errors: false, no per-item answers
    engine.refresh(alias)
    assert engine.count(alias) == 3
    assert sources(engine.mget(alias, ["0", "2", "missing"])) == {
        "0": {"title": "d0"},
        "2": {"title": "d2"},
    }
    return [(m, p.format(alias=alias)) for m, p in ROUND_TRIP_CALLS]


def _find_in_chain(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        current = current.__cause__ or current.__context__
    return None


# -- the tests ----------------------------------------------------------------------------


def test_basic_auth_over_verified_tls(
    engine_kind: str,
    upstream: str,
    alias: str,
    pki: Pki,
    start_proxy: ProxyFactory,
    make_engine: Callable[..., SearchEngine],
) -> None:
    proxy = start_proxy(upstream)
    engine = make_engine(
        engine_kind, proxy, username=USER, password=PASSWORD, ca_certs=str(pki.ca_cert)
    )
    calls = round_trip(engine, alias)
    assert proxy.calls() == calls
    assert {s.principal for s in proxy.requests} == {f"user:{USER}"}
    assert not proxy.handshake_failures


# Elasticsearch only (overriding the conftest's engine_kind): EngineSettings rejects
# api_key for OpenSearch, whose client has no API keys (OpenSearchEngine passes none).
@pytest.mark.parametrize("engine_kind", ["elasticsearch"])
@pytest.mark.parametrize(
    "api_key",
    [f"{KEY_ID}:{KEY_SECRET}", base64.b64encode(f"{KEY_ID}:{KEY_SECRET}".encode()).decode()],
    ids=["id-colon-key", "encoded"],
)
def test_api_key_over_verified_tls(
    engine_kind: str,
    api_key: str,
    upstream: str,
    alias: str,
    pki: Pki,
    start_proxy: ProxyFactory,
    make_engine: Callable[..., SearchEngine],
) -> None:
    proxy = start_proxy(upstream)
    engine = make_engine(engine_kind, proxy, api_key=api_key, ca_certs=str(pki.ca_cert))
    calls = round_trip(engine, alias)
    assert proxy.calls() == calls
    assert {s.principal for s in proxy.requests} == {f"api_key:{KEY_ID}"}


def test_mutual_tls_with_a_client_certificate(
    engine_kind: str,
    upstream: str,
    alias: str,
    pki: Pki,
    start_proxy: ProxyFactory,
    make_engine: Callable[..., SearchEngine],
) -> None:
    proxy = start_proxy(upstream, require_client_cert=True)
    engine = make_engine(
        engine_kind,
        proxy,
        username=USER,
        password=PASSWORD,
        ca_certs=str(pki.ca_cert),
        client_cert=str(pki.client_cert),
        client_key=str(pki.client_key),
    )
    calls = round_trip(engine, alias)
    assert proxy.calls() == calls
    assert {(s.principal, s.client_cn) for s in proxy.requests} == {(f"user:{USER}", CLIENT_CN)}
    assert not proxy.handshake_failures


def test_without_the_client_certificate_mutual_tls_refuses(
    engine_kind: str,
    upstream: str,
    pki: Pki,
    start_proxy: ProxyFactory,
    make_engine: Callable[..., SearchEngine],
) -> None:
    # The counterpart of the test above: the proxy really does require the certificate.
    proxy = start_proxy(upstream, require_client_cert=True)
    engine = make_engine(
        engine_kind, proxy, username=USER, password=PASSWORD, ca_certs=str(pki.ca_cert)
    )
    # The client sees the server's "certificate required" alert or, racing it, an EOF.
    with pytest.raises(client_errors(engine_kind).SSLError) as caught:
        engine.count("anything")
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in str(proxy.wait_handshake_failure())
    assert proxy.requests == []
    # The alert is permanent and names the setting; an EOF cannot be told from a dropped
    # connection and stays retriable.
    alert = _find_in_chain(caught.value, ssl.SSLError)
    if isinstance(alert, ssl.SSLError) and alert.reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        assert classify(caught.value) is Verdict.PERMANENT
        assert "client_cert" in operator_hint(caught.value)
    else:
        assert classify(caught.value) is Verdict.RETRIABLE


@pytest.mark.parametrize(
    ("engine_kind", "credentials"),  # overrides the conftest fixture: API keys are ES-only
    [("opensearch", "password"), ("elasticsearch", "password"), ("elasticsearch", "api_key")],
)
def test_wrong_credentials_are_permanent_with_a_hint(
    engine_kind: str,
    credentials: str,
    upstream: str,
    pki: Pki,
    start_proxy: ProxyFactory,
    make_engine: Callable[..., SearchEngine],
) -> None:
    proxy = start_proxy(upstream)
    wrong: dict[str, Any] = (
        {"username": USER, "password": "not-the-password"}
        if credentials == "password"
        else {"api_key": f"{KEY_ID}:not-the-key"}
    )
    engine = make_engine(engine_kind, proxy, ca_certs=str(pki.ca_cert), **wrong)
    with pytest.raises(client_errors(engine_kind).AuthenticationException) as caught:
        engine.count("anything")
    exc = caught.value
    assert exc.status_code == 401
    assert classify(exc) is Verdict.PERMANENT
    assert operator_hint(exc) == CREDENTIALS_HINT
    # What the operator reads: shared.cli prints "<exc> — <hint>" for a permanent error.
    # The clients' str() keeps the status and error type but not the engine's "reason",
    # which stays in exc.info.
    assert f"{exc} — {operator_hint(exc)}" == (
        f"AuthenticationException(401, 'security_exception') — {CREDENTIALS_HINT}"
    )
    assert exc.info["error"]["reason"] == "test proxy: missing or wrong credentials"
    assert not engine.ping()
    assert proxy.calls() == [("GET", "/anything/_count"), ("GET", "/_cluster/health")]
    assert {s.principal for s in proxy.requests} == {None}


def test_a_ca_that_did_not_sign_the_server_certificate_fails_the_handshake(
    engine_kind: str,
    upstream: str,
    pki: Pki,
    start_proxy: ProxyFactory,
    make_engine: Callable[..., SearchEngine],
) -> None:
    proxy = start_proxy(upstream)
    engine = make_engine(
        engine_kind, proxy, username=USER, password=PASSWORD, ca_certs=str(pki.rogue_ca_cert)
    )
    with pytest.raises(client_errors(engine_kind).SSLError) as caught:
        engine.count("anything")
    exc = caught.value
    assert "unknown ca" in str(proxy.wait_handshake_failure()).lower()
    assert proxy.requests == []
    # A wrong CA file is a misconfiguration: permanent, and the hint names the setting
    # (kafka2search never gives up on retriable errors, so this must not be one). The
    # verification error is in the chain (elasticsearch-py 8 says only "TLS error" itself).
    cause = _find_in_chain(exc, ssl.SSLCertVerificationError)
    assert isinstance(cause, ssl.SSLError)
    assert "CERTIFICATE_VERIFY_FAILED" in str(cause)
    assert classify(exc) is Verdict.PERMANENT
    assert "ca_certs" in operator_hint(exc)


def test_verify_certs_off_accepts_an_unknown_certificate(
    engine_kind: str,
    upstream: str,
    alias: str,
    start_proxy: ProxyFactory,
    make_engine: Callable[..., SearchEngine],
) -> None:
    proxy = start_proxy(upstream)
    engine = make_engine(engine_kind, proxy, username=USER, password=PASSWORD, verify_certs=False)
    calls = round_trip(engine, alias)
    assert proxy.calls() == calls
    assert {s.principal for s in proxy.requests} == {f"user:{USER}"}
