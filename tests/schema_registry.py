"""A TEST DOUBLE of a Confluent-compatible Schema Registry, for tests only.

No real schema registry can be installed on the machines walcast is built on (Confluent's
is not on the reachable Maven Central, Karapace is not on PyPI, Apicurio's build needs
missing artifacts). walcast's production path is confluent-kafka's standard registry
client against any Confluent-compatible registry; this double serves the subset of the
REST API that path uses, so the tests exercise the real client over real HTTP:

- ``POST /subjects/{subject}/versions`` — register (the same schema again: its id;
  refused with 409 when the subject's compatibility level says it is incompatible);
- ``POST /subjects/{subject}`` — look a schema up; ``GET /subjects``,
  ``GET /subjects/{subject}/versions[/{version|latest}]``, ``DELETE /subjects/{subject}``;
- ``GET /schemas/ids/{id}``;
- ``POST /compatibility/subjects/{subject}/versions/{version|latest}``;
- ``GET|PUT /config`` and ``/config/{subject}`` (``NONE``, ``BACKWARD`` (the default),
  ``FORWARD``, ``FULL`` and their ``_TRANSITIVE`` forms).

Compatibility follows Avro's schema-resolution rules (a reader can read a writer's data):
records by name with fields matched by name, a reader's missing field needing a default,
the numeric promotions, string/bytes, unions branch by branch, enums by symbols, arrays
and maps by their items. AVRO schemas only; no references, contexts, modes or auth.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

LEVELS = {"NONE", "BACKWARD", "FORWARD", "FULL", "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE",
          "FULL_TRANSITIVE"}  # fmt: skip
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_PROMOTIONS = {
    ("long", "int"),
    ("float", "int"),
    ("float", "long"),
    ("double", "int"),
    ("double", "long"),
    ("double", "float"),
    ("string", "bytes"),
    ("bytes", "string"),
}  # fmt: skip  (reader, writer)


class _Names:
    """Named types of one schema, by full name and by simple name."""

    def __init__(self) -> None:
        self.types: dict[str, Any] = {}

    def add(self, schema: dict[str, Any], namespace: str | None) -> str | None:
        name = schema.get("name")
        if not isinstance(name, str):
            return namespace
        ns = schema.get("namespace", namespace)
        full = name if "." in name or not ns else f"{ns}.{name}"
        self.types[full] = schema
        self.types.setdefault(name.rsplit(".", 1)[-1], schema)
        return full.rsplit(".", 1)[0] if "." in full else None


def _collect(schema: Any, names: _Names, namespace: str | None = None) -> None:
    if isinstance(schema, list):
        for s in schema:
            _collect(s, names, namespace)
    elif isinstance(schema, dict):
        t = schema.get("type")
        if t in ("record", "error", "enum", "fixed"):
            namespace = names.add(schema, namespace)
        for f in schema.get("fields", ()):
            _collect(f.get("type"), names, namespace)
        for k in ("items", "values"):
            if k in schema:
                _collect(schema[k], names, namespace)
        if isinstance(t, (dict, list)):
            _collect(t, names, namespace)


_COMPLEX = {"record", "error", "enum", "fixed", "array", "map"}


def _resolve(schema: Any, names: _Names) -> Any:
    """A named reference as its definition, an annotated primitive (a logical type,
    Connect's attributes) as the primitive: neither changes how data resolves."""
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return schema
        return names.types.get(schema, names.types.get(schema.rsplit(".", 1)[-1], schema))
    if isinstance(schema, dict):
        t = schema.get("type")
        if isinstance(t, str) and t in _PRIMITIVES:
            return t
        if isinstance(t, (dict, list)) or (isinstance(t, str) and t not in _COMPLEX):
            return _resolve(t, names)
    return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    t = schema.get("type")
    return "record" if t == "error" else str(t)


def readable(reader: Any, writer: Any, rn: _Names, wn: _Names, path: str = "") -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    reader, writer = _resolve(reader, rn), _resolve(writer, wn)
    rk, wk = _kind(reader), _kind(writer)
    if wk == "union":
        out: list[str] = []
        for i, branch in enumerate(writer):
            out += readable(reader, branch, rn, wn, f"{path}[{i}]")
        return out
    if rk == "union":
        if any(not readable(branch, writer, rn, wn, path) for branch in reader):
            return []
        return [f"{path or '/'}: the reader's union has no branch for the writer's {wk}"]
    if rk != wk:
        if (rk, wk) in _PROMOTIONS:
            return []
        return [f"{path or '/'}: reader type {rk} cannot read writer type {wk}"]
    if rk == "record":
        rname = str(reader.get("name", "")).rsplit(".", 1)[-1]
        wname = str(writer.get("name", "")).rsplit(".", 1)[-1]
        if rname != wname:
            return [f"{path or '/'}: record {wname} read as {rname}"]
        wfields = {f["name"]: f for f in writer.get("fields", ())}
        out = []
        for f in reader.get("fields", ()):
            names = [f["name"], *f.get("aliases", ())]
            w = next((wfields[n] for n in names if n in wfields), None)
            if w is None:
                if "default" not in f:
                    out.append(f"{path}/{f['name']}: a field the writer lacks, without a default")
                continue
            out += readable(f["type"], w["type"], rn, wn, f"{path}/{f['name']}")
        return out
    if rk == "enum":
        missing = set(writer.get("symbols", ())) - set(reader.get("symbols", ()))
        if missing and "default" not in reader:
            return [f"{path or '/'}: enum symbols {sorted(missing)} unknown to the reader"]
        return []
    if rk == "array":
        return readable(reader["items"], writer["items"], rn, wn, f"{path}/items")
    if rk == "map":
        return readable(reader["values"], writer["values"], rn, wn, f"{path}/values")
    if rk == "fixed" and reader.get("size") != writer.get("size"):
        return [f"{path or '/'}: fixed sizes differ"]
    return []


def incompatibilities(level: str, new: str, old: list[str]) -> list[str]:
    """Why ``new`` breaks ``level`` against the subject's versions ``old`` (oldest first)."""
    if level == "NONE" or not old:
        return []
    against = old if level.endswith("_TRANSITIVE") else old[-1:]
    base = level.removesuffix("_TRANSITIVE")
    out: list[str] = []
    n = json.loads(new)
    nn = _Names()
    _collect(n, nn)
    for text in against:
        o = json.loads(text)
        on = _Names()
        _collect(o, on)
        if base in ("BACKWARD", "FULL"):
            out += [f"BACKWARD: {m}" for m in readable(n, o, nn, on)]
        if base in ("FORWARD", "FULL"):
            out += [f"FORWARD: {m}" for m in readable(o, n, on, nn)]
    return out


def _canonical(schema: str) -> str:
    return json.dumps(json.loads(schema), sort_keys=True, separators=(",", ":"))


@dataclass
class Registry:
    """The registry's state: schemas by id, subjects' versions, compatibility levels."""

    schemas: dict[int, str] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)
    level: str = "BACKWARD"
    levels: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def id_of(self, schema: str) -> int | None:
        canon = _canonical(schema)
        return next((i for i, s in self.schemas.items() if _canonical(s) == canon), None)

    def register(self, subject: str, schema: str) -> tuple[int, dict[str, Any]]:
        versions = self.subjects.setdefault(subject, [])
        existing = self.id_of(schema)
        if existing is not None and existing in versions:
            return 200, {"id": existing}
        level = self.levels.get(subject, self.level)
        why = incompatibilities(level, schema, [self.schemas[i] for i in versions])
        if why:
            return 409, {
                "error_code": 409,
                "message": f"Schema being registered is incompatible with an earlier schema"
                f' for subject "{subject}" ({level}): {"; ".join(why)}',
            }
        sid = existing if existing is not None else max(self.schemas, default=0) + 1
        self.schemas[sid] = schema
        versions.append(sid)
        return 200, {"id": sid}

    def version(self, subject: str, v: str) -> tuple[int, dict[str, Any]]:
        versions = self.subjects.get(subject)
        if not versions:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        n = len(versions) if v in ("latest", "-1") else int(v)
        if not 1 <= n <= len(versions):
            return 404, {"error_code": 40402, "message": f"Version {v} not found."}
        sid = versions[n - 1]
        return 200, {"subject": subject, "version": n, "id": sid, "schema": self.schemas[sid]}


class _Handler(BaseHTTPRequestHandler):
    registry: Registry

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/vnd.schemaregistry.v1+json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("content-length") or 0)
        return json.loads(self.rfile.read(n)) if n else {}

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        r = self.registry
        with r.lock:
            r.requests.append((method, path))
            status, body = self._answer(method, [p for p in path.split("/") if p], r)
        self._send(status, body)

    def _answer(self, method: str, parts: list[str], r: Registry) -> tuple[int, Any]:
        parts = [unquote(p) for p in parts]
        match method, parts:
            case "GET", ["subjects"]:
                return 200, sorted(s for s, v in r.subjects.items() if v)
            case "POST", ["subjects", subject, "versions"]:
                body = self._body()
                if body.get("schemaType", "AVRO") != "AVRO":
                    return 422, {"error_code": 42201, "message": "AVRO schemas only (test double)"}
                return r.register(subject, body["schema"])
            case "POST", ["subjects", subject]:
                sid = r.id_of(self._body()["schema"])
                versions = r.subjects.get(subject, [])
                if sid is None or sid not in versions:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, {"subject": subject, "id": sid, "version": versions.index(sid) + 1,
                             "schema": r.schemas[sid]}  # fmt: skip
            case "GET", ["subjects", subject, "versions"]:
                versions = r.subjects.get(subject)
                if not versions:
                    return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
                return 200, list(range(1, len(versions) + 1))
            case "GET", ["subjects", subject, "versions", v]:
                return r.version(subject, v)
            case "DELETE", ["subjects", subject]:
                versions = r.subjects.pop(subject, [])
                return 200, list(range(1, len(versions) + 1))
            case "GET", ["schemas", "ids", sid]:
                schema = r.schemas.get(int(sid))
                if schema is None:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, {"schema": schema}
            case "POST", ["compatibility", "subjects", subject, "versions", v]:
                status, found = r.version(subject, v)
                if status != 200:
                    return status, found
                level = r.levels.get(subject, r.level)
                versions = r.subjects[subject][: found["version"]]
                why = incompatibilities(level, self._body()["schema"],
                                        [r.schemas[i] for i in versions])  # fmt: skip
                return 200, {"is_compatible": not why, "messages": why}
            case "GET", ["config"]:
                return 200, {"compatibilityLevel": r.level}
            case "PUT", ["config"]:
                level = self._body().get("compatibility", "")
                if level not in LEVELS:
                    return 422, {"error_code": 42203, "message": f"Invalid compatibility {level}"}
                r.level = level
                return 200, {"compatibility": level}
            case "GET", ["config", subject]:
                if subject not in r.levels:
                    return 404, {"error_code": 40408, "message": "Subject has no level"}
                return 200, {"compatibilityLevel": r.levels[subject]}
            case "PUT", ["config", subject]:
                level = self._body().get("compatibility", "")
                if level not in LEVELS:
                    return 422, {"error_code": 42203, "message": f"Invalid compatibility {level}"}
                r.levels[subject] = level
                return 200, {"compatibility": level}
        return 404, {"error_code": 404, "message": f"{method} /{'/'.join(parts)}: not served"}

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")


@contextmanager
def running() -> Iterator[tuple[str, Registry]]:
    """A registry double on 127.0.0.1 (a free port): its URL and its state."""
    registry = Registry()
    handler = type("Handler", (_Handler,), {"registry": registry})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="schema-registry", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", registry
    finally:
        server.shutdown()
        server.server_close()


__all__ = ["LEVELS", "Registry", "incompatibilities", "readable", "running"]
