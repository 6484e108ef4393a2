"""The search engine adapters: :class:`OpenSearchEngine` (opensearch-py) and
:class:`ElasticsearchEngine` (elasticsearch-py, major version matching the server).

:class:`SearchEngine` is the role (a protocol: what the indexer, the admin commands and
the tests' fakes agree on). Both engines speak the same REST API for what walcast needs,
so one :class:`HttpSearchEngine` sends the requests through the client's transport
(connection pool, TLS, auth, sniffing come from the client) and the subclasses only build
their client. The clients' own retries
are off: retries wrap this adapter (``shared.retry``), and ``shared.errors.classify``
decides what is worth retrying (429, 5xx, connection errors).

Why one file of ~620 lines: the role, its one HTTP implementation and the two client
builders are read together (each engine call is one method here); what a document's
stamp is lives apart, in :mod:`services.kafka2search.stamps`.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

import orjson

from services.kafka2search.settings import EngineSettings, IndexSettings
from services.kafka2search.stamps import mget_documents, restamped
from shared.contract.event import UNFILLED
from shared.errors import PermanentError, RetriableError, Verdict, http_status_verdict


class Stored(NamedTuple):
    """A document as the engine holds it: its version (the LSN of the change written), its
    ``_source``, and whether that is as kafka2search wrote it (its stamp:
    :func:`~services.kafka2search.stamps.body_intact`; None: unstamped or not read whole)."""

    version: int
    source: dict[str, Any]
    intact: bool | None = None


class SearchEngine(Protocol):
    """One search engine, as walcast uses it. Every method raises on an HTTP error (the
    client's exception, classified by ``shared.errors.classify``), except where noted."""

    name: str

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any: ...

    def request_raw(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> bytes:
        """:meth:`request`, its answer's body as the engine sent it (unparsed): what a
        document's ``_source`` is byte for byte (:mod:`services.kafka2search.stamps`)."""
        ...

    def bulk(self, ndjson: bytes, *, require_alias: bool = True) -> list[dict[str, Any]] | None:
        """The items' results, or None when every action succeeded. ``require_alias``:
        the actions name aliases, and a missing one is an error (404), never a new
        index created on the fly."""
        ...

    def mget(
        self, index: str, ids: list[str], fields: list[str] | None = None
    ) -> dict[str, Stored]:
        """The documents of ``ids`` that exist, by id (``fields``: only those of their
        ``_source``)."""
        ...

    def count(self, index: str) -> int: ...

    def refresh(self, index: str) -> None: ...

    def delete_older(
        self,
        index: str,
        version: int,
        *,
        reopen: bool = False,
        within: dict[str, Any] | None = None,
    ) -> int:
        """Remove every document whose version (the LSN of its change) is below
        ``version``, as a delete versioned ``version``: newer documents stay, and an
        older write arriving later is refused while the engine remembers the delete.
        ``reopen``: versioned ``version - 1`` instead, so a write carrying exactly
        ``version`` still lands (a snapshot's end marker: its rows carry that version).
        ``within``: only the documents this query matches (a snapshot of key ranges).
        Waits until done and visible; returns how many documents were removed."""
        ...

    def rewrite_field(self, index: str, field: str, to: str | None) -> int:
        """Rename ``field`` to ``to`` (None: remove it) in every document that has it, each
        rewritten at its own version; a document written again meanwhile keeps its newer
        write. Waits until done and visible; returns how many documents changed."""
        ...

    def resolve_alias(self, alias: str) -> str | None:
        """The index behind ``alias`` (None when the alias does not exist)."""
        ...

    def exists(self, path: str) -> bool: ...

    def create_index(
        self,
        index: str,
        alias: str,
        settings: IndexSettings,
        properties: dict[str, Any],
        meta: dict[str, Any],
    ) -> bool:
        """Create ``index`` behind ``alias``; False when it already existed."""
        ...

    def mapping(self, index: str) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def put_mapping(
        self, index: str, properties: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> None: ...

    def delete_index(self, index: str) -> None: ...

    def aliases(self, pattern: str) -> dict[str, str]: ...

    def ping(self) -> bool:
        """Readiness: True or False, never raises."""
        ...

    def close(self) -> None: ...


class HttpSearchEngine(SearchEngine):
    """REST calls against one engine through its client's transport."""

    name = "search engine"

    def __init__(self, client: Any) -> None:
        self.client = client

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        return self.client.transport.perform_request(
            method, path, params=params or None, body=body, headers=headers
        )

    def request_raw(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> bytes:
        with _unparsed():
            answer = self.request(method, path, body=body, params=params)
        if isinstance(answer, str):  # opensearch-py decodes answers (surrogatepass)
            return answer.encode("utf-8", "surrogatepass")
        if not isinstance(answer, bytes):
            raise RetriableError(f"{self.name} answered {method} {path} with no body")
        return answer

    # -- documents ---------------------------------------------------------------------

    def bulk(self, ndjson: bytes, *, require_alias: bool = True) -> list[dict[str, Any]] | None:
        """Send a bulk body; returns one result per action, in order (``status``, and
        ``error`` for a failed one), or None when every action succeeded (the engine
        answered ``errors: false``; a delete of a missing document is not an error
        either). A failed item does not fail the request. With ``require_alias`` a
        write to an alias that is gone fails (404) instead of auto-creating an index with
        guessed mappings under the alias's name (which then blocked the alias for good)."""
        params = {"filter_path": "errors,items.*.status,items.*.error"}
        if require_alias:
            params["require_alias"] = "true"
        answer = self.request(
            "POST",
            "/_bulk",
            body=ndjson,
            # Only what is read back: the full answer is ~200 bytes of JSON per item.
            params=params,
            headers={"content-type": "application/x-ndjson"},
        )
        if answer.get("errors") is False:
            return None  # the common case: no per-item answer to look at
        items = answer.get("items", [])
        return [next(iter(item.values())) for item in items]

    def mget(
        self, index: str, ids: list[str], fields: list[str] | None = None
    ) -> dict[str, Stored]:
        if fields is not None:  # a part of each source: parsed, the stamp not checked
            params = {"_source_includes": ",".join(fields)}
            answer = self.request("POST", f"/{index}/_mget", body={"ids": ids}, params=params)
            return {
                d["_id"]: Stored(int(d.get("_version", 0)), d.get("_source", {}))
                for d in answer.get("docs", [])
                if d.get("found")
            }
        return self._mget_whole(index, ids, None)

    def _mget_whole(
        self, index: str, ids: list[str], params: dict[str, Any] | None
    ) -> dict[str, Stored]:
        """Whole documents, each source's stamp checked on its bytes as the engine keeps
        them before it is parsed."""
        raw = self.request_raw("POST", f"/{index}/_mget", body={"ids": ids}, params=params)
        return {
            doc_id: Stored(version, source, intact)
            for doc_id, version, source, intact in mget_documents(raw)
        }

    def count(self, index: str) -> int:
        return int(self.request("GET", f"/{index}/_count")["count"])

    def refresh(self, index: str) -> None:
        self.request("POST", f"/{index}/_refresh")

    def delete_older(
        self,
        index: str,
        version: int,
        page: int = 5000,
        *,
        reopen: bool = False,
        within: dict[str, Any] | None = None,
    ) -> int:
        """A truncate: every document older than ``version`` is deleted with an external
        version of ``version`` (``_delete_by_query`` cannot compare versions, and a
        truncate that reached this consumer through one partition must not remove a
        newer row another partition's consumer already wrote). Pages through the index
        with a scroll, ``page`` documents at a time. ``reopen`` (a snapshot's end
        marker): the deletes are versioned ``version - 1`` with ``external_gte`` (a
        document at exactly ``version - 1`` goes too), so a write at ``version`` still
        lands after them."""
        self.refresh(index)  # the scroll sees only what was refreshed
        answer = self.request(
            "POST",
            f"/{index}/_search",
            body={
                "size": page,
                "_source": False,
                "version": True,
                "sort": ["_doc"],
                **({"query": within} if within is not None else {}),
            },
            params={"scroll": "2m"},
        )
        scroll_id = answer.get("_scroll_id")
        deleted = 0
        try:
            while hits := answer.get("hits", {}).get("hits", []):
                ids = [h["_id"] for h in hits if int(h.get("_version", 0)) < version]
                if ids:
                    deleted += self._delete_versioned(index, ids, version, reopen)
                answer = self.request(
                    "POST", "/_search/scroll", body={"scroll": "2m", "scroll_id": scroll_id}
                )
                scroll_id = answer.get("_scroll_id", scroll_id)
        finally:
            if scroll_id:
                self.request("DELETE", "/_search/scroll", body={"scroll_id": [scroll_id]})
        self.refresh(index)
        return deleted

    def _delete_versioned(self, index: str, ids: list[str], version: int, reopen: bool) -> int:
        meta = b'"_index":%b,"version":%d,"version_type":"%b"' % (
            orjson.dumps(index),
            version - 1 if reopen else version,
            b"external_gte" if reopen else b"external",
        )
        body = b"".join(
            b'{"delete":{"_id":%b,%b}}\n' % (orjson.dumps(doc_id), meta) for doc_id in ids
        )
        results = self.bulk(body, require_alias=False)  # a concrete index
        if results is None:
            return len(ids)
        done = 0
        for res in results:
            status = int(res.get("status", 0))
            if 200 <= status < 300:
                done += 1
            elif status not in (404, 409):  # gone already / newer than the truncate
                raise PermanentError(
                    f"truncate of {index}: the engine refused a delete ({status}):"
                    f" {res.get('error')}"
                )
        return done

    def rewrite_field(
        self, index: str, field: str, to: str | None, page: int = 1000, max_bytes: int = 8 << 20
    ) -> int:
        """A renamed or dropped column. Read on the client and written back, because the
        engines' server-side way (``_update_by_query`` with a painless script) needs modules
        a minimal Elasticsearch lacks. A scroll pages through every document (an ``exists``
        query would miss fields mapped without an index, such as json columns); each page
        is read again in real time (``_mget``: the scroll's view may be minutes old, and a
        document deleted since must not come back) and the documents having ``field`` are
        indexed again with it moved or removed (also where the document names it as
        unfilled: :func:`shared.contract.event.fill_unfilled`), at their current version with
        ``external_gte``. A write newer than that read (another partition's consumer, after
        the DDL: already in the new shape) makes that rewrite a conflict, which is skipped;
        data writes use ``external``, so a change redelivered at the same version is still
        refused afterwards. Bulk requests stay under ``max_bytes``."""
        self.refresh(index)  # the scroll sees only what was refreshed
        answer = self.request(
            "POST",
            f"/{index}/_search",
            body={"size": page, "_source": False, "sort": ["_doc"]},
            params={"scroll": "2m"},
        )
        scroll_id = answer.get("_scroll_id")
        index_json = orjson.dumps(index)
        changed = 0
        try:
            while hits := answer.get("hits", {}).get("hits", []):
                now = self._mget_whole(index, [h["_id"] for h in hits], {"realtime": "true"})
                lines: list[bytes] = []
                size = 0
                for doc_id, held in now.items():
                    source = held.source
                    if not isinstance(source, dict):
                        continue
                    unfilled = source.get(UNFILLED)
                    names: list[Any] | None = (
                        unfilled if isinstance(unfilled, list) and field in unfilled else None
                    )
                    if field not in source and names is None:
                        continue
                    if field in source:
                        value = source.pop(field)
                        if to is not None:
                            source[to] = value
                    if names is not None:  # a column still to be filled: its new name, or gone
                        rest = [c if c != field else to for c in names if c != field or to]
                        if rest:
                            source[UNFILLED] = rest
                        else:
                            del source[UNFILLED]
                    line = (
                        b'{"index":{"_index":%b,"_id":%b,"version":%d,"version_type":'
                        b'"external_gte"}}\n%b\n'
                        % (index_json, orjson.dumps(doc_id), held.version,
                           restamped(source, held.intact))
                    )  # fmt: skip
                    if lines and size + len(line) > max_bytes:
                        changed += self._count_written(
                            index, self.bulk(b"".join(lines), require_alias=False), len(lines)
                        )
                        lines, size = [], 0
                    lines.append(line)
                    size += len(line)
                if lines:
                    changed += self._count_written(
                        index, self.bulk(b"".join(lines), require_alias=False), len(lines)
                    )
                answer = self.request(
                    "POST", "/_search/scroll", body={"scroll": "2m", "scroll_id": scroll_id}
                )
                scroll_id = answer.get("_scroll_id", scroll_id)
        finally:
            if scroll_id:
                self.request("DELETE", "/_search/scroll", body={"scroll_id": [scroll_id]})
        self.refresh(index)
        return changed

    @staticmethod
    def _count_written(index: str, results: list[dict[str, Any]] | None, sent: int) -> int:
        """How many rewrites landed. A conflict (a newer write) is skipped; an overloaded
        or failing engine (429, 5xx) is retried — the whole rewrite, which is idempotent:
        documents already moved no longer have the field; anything else stops it with the
        engine's words."""
        if results is None:
            return sent
        done = 0
        for res in results:
            status = int(res.get("status", 0))
            if 200 <= status < 300:
                done += 1
            elif status == 409:
                continue
            elif http_status_verdict(status) is Verdict.RETRIABLE:
                raise RetriableError(
                    f"rewriting documents of {index}: the engine answered {status}:"
                    f" {res.get('error')}"
                )
            else:
                raise PermanentError(
                    f"rewriting documents of {index}: the engine refused one ({status}):"
                    f" {res.get('error')}"
                )
        return done

    # -- indices -----------------------------------------------------------------------

    def resolve_alias(self, alias: str) -> str | None:
        """The index behind ``alias`` (None when the alias does not exist)."""
        return next(iter(self.aliases(alias).values()), None)

    def exists(self, path: str) -> bool:
        try:
            answer = self.request("HEAD", path)
        except Exception as exc:
            if getattr(exc, "status_code", None) == 404:
                return False
            raise
        # The clients' transports answer a HEAD with a bool (a 404 is False, no error).
        return answer if isinstance(answer, bool) else True

    def create_index(
        self,
        index: str,
        alias: str,
        settings: IndexSettings,
        properties: dict[str, Any],
        meta: dict[str, Any],
    ) -> bool:
        """Create ``index`` behind ``alias``; False when it already existed (a concurrent
        instance created it first)."""
        body = {
            "settings": {
                "number_of_shards": settings.shards,
                "number_of_replicas": settings.replicas,
                "refresh_interval": settings.refresh_interval,
                "gc_deletes": settings.gc_deletes,
            },
            "mappings": {"dynamic": False, "_meta": meta, "properties": properties},
            "aliases": {alias: {"is_write_index": True}},
        }
        try:
            self.request("PUT", f"/{index}", body=body)
        except Exception as exc:
            if getattr(exc, "status_code", None) == 400 and "already_exists" in str(exc):
                return False
            raise
        return True

    def mapping(self, index: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(properties, _meta) of ``index``."""
        answer = self.request("GET", f"/{index}/_mapping")
        mappings = next(iter(answer.values()))["mappings"]
        return mappings.get("properties", {}), mappings.get("_meta", {})

    def put_mapping(
        self, index: str, properties: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> None:
        body: dict[str, Any] = {"properties": properties}
        if meta is not None:
            body["_meta"] = meta
        self.request("PUT", f"/{index}/_mapping", body=body)

    def delete_index(self, index: str) -> None:
        self.request("DELETE", f"/{index}", params={"ignore_unavailable": "true"})

    def aliases(self, pattern: str) -> dict[str, str]:
        """alias -> index for aliases matching ``pattern`` (wildcards allowed)."""
        rows = self.request("GET", f"/_cat/aliases/{pattern}", params={"format": "json"})
        return {row["alias"]: row["index"] for row in rows}

    def ping(self) -> bool:
        """The cluster's health answers (``GET /`` is not served by every distribution:
        a minimal Elasticsearch 8 answers 405)."""
        try:
            self.request("GET", "/_cluster/health")
        except Exception:  # noqa: BLE001 - readiness answers yes or no
            return False
        return True

    def close(self) -> None:
        self.client.close()


def _client_options(s: EngineSettings) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "hosts": list(s.urls),
        "timeout": s.request_timeout_s,
        "max_retries": 0,
        "retry_on_timeout": False,
    }
    if any(u.startswith("https://") for u in s.urls):
        opts["use_ssl"] = True
    opts.update(_tls_options(s))
    if s.username is not None and s.password is not None:
        opts["http_auth"] = (s.username, s.password.get_secret_value())
    return opts


def _tls_options(s: EngineSettings) -> dict[str, Any]:
    """The TLS options both clients name alike, for https:// URLs (none otherwise)."""
    if not any(u.startswith("https://") for u in s.urls):
        return {}
    opts: dict[str, Any] = {"verify_certs": s.verify_certs}
    if s.ca_certs is not None:
        opts["ca_certs"] = str(s.ca_certs)
    if s.client_cert is not None:
        opts["client_cert"] = str(s.client_cert)
    if s.client_key is not None:
        opts["client_key"] = str(s.client_key)
    if not s.verify_certs:
        opts["ssl_show_warn"] = False
    return opts


_RAW = threading.local()


@contextmanager
def _unparsed() -> Iterator[None]:
    """Answers received by this thread meanwhile are left as the engine sent them (the
    clients parse every answer, and take no option against it)."""
    _RAW.on = True
    try:
        yield
    finally:
        _RAW.on = False


def _orjson_serializer(base: type[Any], error: type[Exception]) -> Any:
    """The client's JSON serializer with orjson parsing answers (the stdlib parser took
    as long as the rest of a bulk round trip on our side), or not parsing them at all
    inside :func:`_unparsed`."""

    class OrjsonSerializer(base):  # type: ignore[misc]
        def loads(self, s: str | bytes, *args: Any) -> Any:
            if getattr(_RAW, "on", False):
                return s
            if not s:
                return None  # an empty answer (as the clients' own serializers do)
            try:
                return orjson.loads(s)
            except orjson.JSONDecodeError as exc:
                raise error(f"the engine's answer is not JSON: {exc}") from exc

    return OrjsonSerializer()


class OpenSearchEngine(HttpSearchEngine):
    name = "OpenSearch"

    def __init__(self, settings: EngineSettings) -> None:
        from opensearchpy import OpenSearch
        from opensearchpy.exceptions import SerializationError
        from opensearchpy.serializer import JSONSerializer

        serializer = _orjson_serializer(JSONSerializer, SerializationError)
        # urllib3 keeps one connection per host unless told: the writer threads would
        # reconnect for every request (elasticsearch-py keeps 10 by default).
        client = OpenSearch(**_client_options(settings), serializer=serializer, pool_maxsize=10)
        super().__init__(client)


class ElasticsearchEngine(HttpSearchEngine):
    """Elasticsearch 8.x through elasticsearch-py 8.x. The client speaks the compatibility
    media type (``compatible-with=8``) and checks the server identifies as Elasticsearch;
    its options and its low-level call differ from opensearch-py's (the 7.x lineage), so
    this subclass builds both itself."""

    name = "Elasticsearch"

    def __init__(self, settings: EngineSettings) -> None:
        from elasticsearch import Elasticsearch
        from elasticsearch.exceptions import SerializationError
        from elasticsearch.serializer import OrjsonSerializer

        opts: dict[str, Any] = {
            "hosts": list(settings.urls),
            "request_timeout": settings.request_timeout_s,
            "max_retries": 0,
            "retry_on_timeout": False,
            # The client parses answers with orjson (the stdlib parser took as long as the
            # rest of a bulk round trip on our side); the compatibility type follows.
            "serializer": _orjson_serializer(OrjsonSerializer, SerializationError),
        }
        opts.update(_tls_options(settings))  # the scheme is in the URLs (no use_ssl)
        if settings.username is not None and settings.password is not None:
            opts["basic_auth"] = (settings.username, settings.password.get_secret_value())
        if settings.api_key is not None:
            opts["api_key"] = api_key_header_value(settings.api_key.get_secret_value())
        super().__init__(Elasticsearch(**opts))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The client's low-level call; the answer's body (a bool for HEAD). The media
        types are named here because the client adds them only in its typed API methods."""
        sent = {"accept": "application/json"}
        if body is not None:
            sent["content-type"] = "application/json"
        if headers:
            sent.update(headers)
        answer = self.client.perform_request(
            method, path, params=params or None, headers=sent, body=body
        )
        return answer.body


def api_key_header_value(api_key: str) -> str:
    """Accept "id:key" or the already-encoded form; return the encoded form."""
    if ":" in api_key:
        return base64.b64encode(api_key.encode()).decode()
    return api_key


def engine_for(settings: EngineSettings) -> SearchEngine:
    if settings.kind == "opensearch":
        return OpenSearchEngine(settings)
    if settings.kind == "elasticsearch":
        return ElasticsearchEngine(settings)
    raise PermanentError(
        f"unknown engine kind {settings.kind!r}", hint="opensearch or elasticsearch"
    )


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)
