"""walcast's change event in Avro, in the Confluent wire format, with a schema registry.

(Over 600 lines on purpose: the Avro encoding is decided in this one place — schemas,
wire format, registry client and decoding — so no caller re-decides it.)

**The wire format**: a zero byte, the schema's registry id (4 bytes, big-endian), then
the Avro binary encoding of the record (fastavro) — what every Confluent-compatible
consumer and registry-aware deserializer reads.

**The schemas**: one record schema per table, ``walcast.<db>.<schema>.<table>.Event``
(each name part reduced to Avro's name characters), generated from the event's ``types``:
the envelope's fields (``op``, ``lsn``, ... as in docs/events.md) with ``key``, ``new``
and ``old`` as records of the table's columns. Values keep walcast's JSON encoding where
Avro has no exact equal, so nothing is lost and a consumer gets back the very event:

- integers → ``int`` (``int2``, ``int4``) / ``long``; boolean → ``boolean``;
  floats → ``double`` or, for ``NaN`` / ``±Infinity`` (which walcast's event keeps as
  text), ``string``; bytea → ``bytes``; json / jsonb → ``string`` holding the JSON text;
  everything else (numeric's exact digits, dates and timestamps in ISO-8601 with
  ``infinity`` and expanded years, intervals, ...) → ``string``, as in the JSON event;
- arrays → ``array`` of the element (one dimension; a multi-dimensional value is refused
  with the column named);
- every column is nullable with a ``null`` default, so adding or dropping a column is a
  compatible change under the registry's default ``BACKWARD`` rule; changing a column's
  type is not, and the registry refuses it (:class:`RegistryEncoder` says what to do).

Each column field carries its Postgres type and original name as attributes
(``pg_type``, ``pg_name``: Avro field names are restricted), which is how
:func:`event_from_avro` rebuilds ``types`` and the rows' column names.

**Subjects** (``subject_name_strategy``): ``topic`` — ``<topic>-value`` (Confluent's
default; one table per topic), ``record`` — the record's full name, ``topic_record`` —
``<topic>-<record name>`` (several tables in one topic).
"""

from __future__ import annotations

import base64
import io
import re
import struct
import threading
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

import fastavro
import msgspec
import orjson

from shared.contract import limits
from shared.contract.event import EventDecodeError
from shared.contract.pgtypes import by_name
from shared.formats.debezium_avro import avro_schema, connect_schema, from_datum, to_datum

SubjectStrategy = Literal["topic", "record", "topic_record"]
Shape = tuple[Mapping[str, str], list[str]]
"""A table's columns (name → Postgres type, as events' ``types``) and its key's columns."""
MAGIC = 0
_HEADER = struct.Struct(">bI")
_NAME_BAD = re.compile(r"[^A-Za-z0-9_]")


def avro_name(text: str) -> str:
    """A valid Avro name for ``text``: other characters as ``_``, a leading digit (or an
    empty name) prefixed by ``_``."""
    name = _NAME_BAD.sub("_", text)
    return name if name and not name[0].isdigit() else "_" + name


def record_name(db: str, schema: str, table: str) -> str:
    return ".".join(("walcast", avro_name(db), avro_name(schema), avro_name(table), "Event"))


def subject(strategy: SubjectStrategy, topic: str, record: str, key: bool = False) -> str:
    if strategy == "topic":
        return f"{topic}-key" if key else f"{topic}-value"
    if strategy == "record":
        return record
    return f"{topic}-{record}"


# -- schema ----------------------------------------------------------------------------------


def _value_type(pg_type: str) -> Any:
    row, is_array = by_name(pg_type)
    kind = row.kind if row is not None else "s"
    if kind == "i":
        base: Any = "int" if row is not None and row.name in ("int2", "int4") else "long"
    elif kind == "b":
        base = "boolean"
    elif kind == "f":
        base = ["double", "string"]
    elif kind == "x":
        base = "bytes"
    else:
        base = "string"
    if is_array:
        items = ["null", *base] if isinstance(base, list) else ["null", base]
        return {"type": "array", "items": items}
    return base


def _nullable(t: Any) -> list[Any]:
    return ["null", *t] if isinstance(t, list) else ["null", t]


def _columns(columns: Mapping[str, str]) -> list[dict[str, Any]]:
    """Fields of a row record: unique Avro names, original name and type as attributes."""
    fields = []
    taken: set[str] = set()
    for column, pg_type in columns.items():
        name = avro_name(column)
        while name in taken:
            name += "_"
        taken.add(name)
        fields.append({"name": name, "type": _nullable(_value_type(pg_type)), "default": None,
                       "pg_name": column, "pg_type": pg_type})  # fmt: skip
    return fields


def event_schema(db: str, schema: str, table: str, types: Mapping[str, str],
                 key: list[str]) -> dict[str, Any]:  # fmt: skip
    """The Avro schema of a table's events: ``types`` column → Postgres type (the event's
    ``types``), ``key`` the key's columns (empty: none)."""
    name = record_name(db, schema, table)
    ns = name.rsplit(".", 1)[0]
    row = {"type": "record", "name": "Row", "namespace": ns, "fields": _columns(types)}
    key_row = {"type": "record", "name": "Key", "namespace": ns,
               "fields": _columns({k: types.get(k, "text") for k in key})}  # fmt: skip
    opt_long = {"type": ["null", "long"], "default": None}
    opt_string = {"type": ["null", "string"], "default": None}
    return {
        "type": "record",
        "name": "Event",
        "namespace": ns,
        "fields": [
            {"name": "v", "type": "int"},
            {"name": "op", "type": "string"},
            {"name": "db", "type": "string"},
            {"name": "schema", "type": "string"},
            {"name": "table", "type": "string"},
            {"name": "lsn", "type": "long"},
            {"name": "seq", "type": "long"},
            {"name": "commit_lsn", "type": "long"},
            {"name": "xid", "type": "long"},
            {"name": "commit_ts", "type": "string"},
            {"name": "key", "type": ["null", key_row], "default": None},  # null: {}
            {"name": "new", "type": ["null", row], "default": None},
            {"name": "old", "type": ["null", "Row"], "default": None},
            # The columns ``old`` holds when not all (a key-only image): the others are
            # absent, not null.
            {"name": "old_columns", "type": ["null", {"type": "array", "items": "string"}],
             "default": None},
            {"name": "unchanged_toast", "type": ["null", {"type": "array", "items": "string"}],
             "default": None},
            # DDL and snapshot details, rare: their JSON, as in the JSON event.
            {"name": "ddl", **opt_string},
            {"name": "snapshot", **opt_string},
            {"name": "oversized", **opt_long},
            {"name": "epoch", **opt_long},
            # True on an insert-only table's rows (shared/contract/event.py); null else.
            {"name": "append_only", "type": ["null", "boolean"], "default": None},
            # The row hash of ``new`` (shared/contract/rowhash.py); last, with a default, so
            # schemas registered before it stay compatible.
            {"name": "hash", **opt_long},
            # A verification marker's JSON (op verify), as in the JSON event; last, with a
            # default, like ``hash``.
            {"name": "verify", **opt_string},
        ],
    }  # fmt: skip


# -- values ----------------------------------------------------------------------------------


def _to_avro(value: Any, kind: str, column: str) -> Any:
    if value is None:
        return None
    if kind == "j":  # the JSON's own text when it came as such (exact numbers)
        return (
            bytes(value).decode()
            if isinstance(value, msgspec.Raw)
            else orjson.dumps(value).decode()
        )
    if kind == "x":
        return base64.b64decode(value)
    if isinstance(value, list):
        raise ValueError(f"column {column!r}: a multi-dimensional array has no Avro form here")
    return value


_Plan = tuple[tuple[str, str, str, bool], ...]  # (Avro name, column, kind, is an array)


@lru_cache(maxsize=4096)
def _plan_of(columns: tuple[tuple[str, str, str], ...]) -> _Plan:
    out = []
    for name, column, pg_type in columns:
        row, is_array = by_name(pg_type)
        out.append((name, column, row.kind if row is not None else "s", is_array))
    return tuple(out)


def _plan(fields: list[dict[str, Any]]) -> _Plan:
    """How each column converts, worked out once per row schema."""
    return _plan_of(tuple((f["name"], f["pg_name"], f["pg_type"]) for f in fields))


def _row_to_avro(row: Mapping[str, Any] | None, plan: _Plan) -> Any:
    if row is None:
        return None
    out: dict[str, Any] = {}
    for name, column, kind, is_array in plan:
        value = row.get(column)
        if value is None:
            out[name] = None
        elif is_array:
            if kind in "jx" or any(isinstance(v, list) for v in value):
                value = [_to_avro(v, kind, column) for v in value]
            out[name] = value
        elif kind in "jx":
            out[name] = _to_avro(value, kind, column)
        else:
            out[name] = value
    return out


def _from_avro(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "j":
        return orjson.Fragment(value)
    if kind == "x":
        return base64.b64encode(value).decode()
    return value


def _row_from_avro(datum: Mapping[str, Any] | None, plan: _Plan,
                   present: set[str] | None = None) -> dict[str, Any] | None:  # fmt: skip
    if datum is None:
        return None
    out = {}
    for name, column, kind, is_array in plan:
        if present is not None and column not in present:
            continue
        value = datum.get(name)
        if value is None or kind not in "jx":
            out[column] = value
        elif is_array:
            out[column] = [_from_avro(v, kind) for v in value]
        else:
            out[column] = _from_avro(value, kind)
    return out


def _plans(schema: dict[str, Any]) -> tuple[_Plan, _Plan]:
    """(key plan, row plan) of an event schema."""
    return _plan(_fields(schema, "key")), _plan(_fields(schema, "new"))


def _fields(schema: dict[str, Any], name: str) -> list[dict[str, Any]]:
    for f in schema["fields"]:
        if f["name"] == name:
            t = f["type"]
            record = next(x for x in t if isinstance(x, dict)) if isinstance(t, list) else t
            return list(record["fields"])
    raise KeyError(name)


def event_to_avro(ev: Mapping[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The Avro datum of a change event (plain values: rows as dicts) under its table's
    :func:`event_schema`. A row's columns left out (unchanged TOAST) are null in the
    datum and named in ``unchanged_toast``, as in the event."""
    key_plan, row_plan = _plans(schema)
    old = ev.get("old")
    old_columns = None
    if old is not None and len(old) != len(row_plan):
        old_columns = list(old)
    return {
        "v": ev["v"], "op": ev["op"], "db": ev["db"], "schema": ev["schema"],
        "table": ev["table"], "lsn": ev["lsn"], "seq": ev.get("seq", 0),
        "commit_lsn": ev.get("commit_lsn", ev["lsn"]), "xid": ev.get("xid", 0),
        "commit_ts": ev.get("commit_ts", ""),
        "key": _row_to_avro(ev.get("key") or None, key_plan),
        "old_columns": old_columns,
        "new": _row_to_avro(ev.get("new"), row_plan),
        "old": _row_to_avro(ev.get("old"), row_plan),
        "unchanged_toast": ev.get("unchanged_toast"),
        "ddl": None if ev.get("ddl") is None else orjson.dumps(ev["ddl"]).decode(),
        "snapshot": None if ev.get("snapshot") is None else orjson.dumps(ev["snapshot"]).decode(),
        "oversized": ev.get("oversized"), "epoch": ev.get("epoch"),
        "append_only": ev.get("append_only"), "hash": ev.get("hash"),
        "verify": None if ev.get("verify") is None else orjson.dumps(ev["verify"]).decode(),
    }  # fmt: skip


def event_from_avro(datum: Mapping[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The change event an Avro datum stands for (:func:`event_to_avro` reversed): what
    ``orjson.dumps`` turns into the JSON event, for the event contract's decoder."""
    key_plan, row_plan = _plans(schema)
    toast = datum.get("unchanged_toast")
    present = None
    if toast:
        skip = set(toast)
        present = {p[1] for p in row_plan if p[1] not in skip}
    ev: dict[str, Any] = {
        k: datum[k]
        for k in ("v", "op", "db", "schema", "table", "lsn", "seq", "commit_lsn", "xid",
                  "commit_ts")
    }  # fmt: skip
    ev["key"] = _row_from_avro(datum.get("key"), key_plan) or {}
    ev["new"] = _row_from_avro(datum.get("new"), row_plan, present)
    old_columns = datum.get("old_columns")
    ev["old"] = _row_from_avro(datum.get("old"), row_plan,
                               None if old_columns is None else set(old_columns))  # fmt: skip
    if toast:
        ev["unchanged_toast"] = toast
    if datum.get("hash") is not None:
        ev["hash"] = datum["hash"]
    ev["types"] = {f["pg_name"]: f["pg_type"] for f in _fields(schema, "new")}
    for k in ("ddl", "snapshot", "verify"):
        if datum.get(k) is not None:
            ev[k] = orjson.Fragment(datum[k])
    for k in ("oversized", "epoch", "append_only"):
        if datum.get(k) is not None:
            ev[k] = datum[k]
    return ev


# -- the wire format and the registry --------------------------------------------------------


def frame(schema_id: int, payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, schema_id) + payload


def unframe(data: bytes) -> tuple[int, memoryview]:
    """(schema id, Avro payload) of a Confluent wire-format record."""
    if len(data) < 5 or data[0] != MAGIC:
        raise EventDecodeError("not in the Confluent Avro wire format (no magic byte 0)")
    return _HEADER.unpack_from(data)[1], memoryview(data)[5:]


class RegistryEncoder:
    """``client``: confluent-kafka's ``SchemaRegistryClient`` (:func:`registry_client`).
    Change events to Confluent wire-format records. A table's schema is generated from
    its events' ``types`` and key and registered once per (subject, schema) — again when
    a DDL changes the columns; the registry's compatibility rule decides whether it may
    (a refusal raises with what to do). Thread-safe."""

    def __init__(self, client: Any, strategy: SubjectStrategy = "topic") -> None:
        from confluent_kafka.schema_registry import Schema

        self.client = client
        self.strategy = strategy
        self._schema_cls = Schema
        self._by_table: dict[tuple[Any, ...], tuple[int, Any, dict[str, Any]]] = {}
        self._last: dict[tuple[str, ...], tuple[int, Any, dict[str, Any]]] = {}  # per table
        self._lock = threading.Lock()

    def schema_for(
        self, topic: str, ev: Mapping[str, Any], shape: Shape | None = None
    ) -> tuple[int, Any, dict[str, Any]]:
        """(id, parsed schema, schema) of the event's table as it is now; looked up per
        event by the table's columns (a new schema only when they change)."""
        table = (topic, ev["db"], ev["schema"], ev["table"])
        types = ev.get("types") or {}
        key: Any = ev.get("key") or {}
        if not types and shape is not None:
            types, key = dict(shape[0]), {k: None for k in shape[1]}
        if not types:
            # A control event: a DDL's columns are the table's new schema (registered
            # now, so the registry rules on the change when it happens); a truncate
            # (or a dropped table) is written with the table's last schema.
            ddl = ev.get("ddl")
            if isinstance(ddl, orjson.Fragment):
                ddl = orjson.loads(orjson.dumps(ddl))
            columns = (ddl or {}).get("columns")
            if columns:
                types = {str(c["name"]): str(c["type"]) for c in columns}
                key = {str(k): None for k in (ddl or {}).get("primary_key") or ()}
            elif table in self._last:
                return self._last[table]
            else:
                latest = self._latest(topic, ev)
                if latest is not None:
                    self._last[table] = latest
                    return latest
        if isinstance(types, orjson.Fragment):
            types_id: Any = orjson.dumps(types)
            types = orjson.loads(orjson.dumps(types))
        else:
            types_id = tuple(types.items())
        if isinstance(key, orjson.Fragment):
            key = orjson.loads(orjson.dumps(key))
        cache_key = (topic, ev["db"], ev["schema"], ev["table"], types_id, tuple(key))
        found = self._by_table.get(cache_key)
        if found is not None:
            self._last[table] = found
            return found
        schema = event_schema(ev["db"], ev["schema"], ev["table"], types, list(key))
        subj = subject(self.strategy, topic, schema["namespace"] + ".Event")
        with self._lock:
            found = self._by_table.get(cache_key)
            if found is None:
                schema_id = self._register(subj, orjson.dumps(schema).decode())
                found = (schema_id, fastavro.parse_schema(schema), schema)
                self._by_table[cache_key] = found
        self._last[table] = found
        return found

    def _latest(self, topic: str, ev: Mapping[str, Any]) -> tuple[int, Any, dict[str, Any]] | None:
        """The table's schema as the registry last took it (a control event after a
        restart, before any row of the table), or None."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        name = record_name(ev["db"], ev["schema"], ev["table"])
        try:
            found = self.client.get_latest_version(subject(self.strategy, topic, name))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            from shared.errors import RetriableError

            raise RetriableError(f"schema registry: {exc}") from exc
        schema = orjson.loads(found.schema.schema_str)
        if schema.get("name") != "Event" or schema.get("namespace") != name.rsplit(".", 1)[0]:
            return None  # a subject shared by several tables (topic strategy): not this one
        return int(found.schema_id), fastavro.parse_schema(schema), schema

    def _register(self, subj: str, text: str) -> int:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from shared.errors import PermanentError, RetriableError

        try:
            return int(self.client.register_schema(subj, self._schema_cls(text, "AVRO")))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 409:
                raise PermanentError(
                    f"the schema registry refused the new schema of subject {subj!r}:"
                    f" {exc.error_message}",
                    hint="the table's columns changed in a way the subject's compatibility"
                    " level does not allow (a changed type): set the subject's level (e.g."
                    " NONE) and restart, or move the table to a new topic",
                ) from exc
            if exc.http_status_code in (401, 403):
                raise PermanentError(
                    f"the schema registry refused pg2kafka's credentials: {exc.error_message}",
                    hint="check schema_registry.username / password",
                ) from exc
            if exc.http_status_code is not None and 400 <= exc.http_status_code < 500:
                raise PermanentError(
                    f"the schema registry refused the schema of subject {subj!r}:"
                    f" {exc.error_message} ({exc.http_status_code})",
                    hint="a registry that does not take walcast's Avro schemas: check"
                    " schema_registry.url and the subject's settings",
                ) from exc
            raise RetriableError(f"schema registry: {exc}") from exc
        except Exception as exc:  # the client's transport errors
            raise RetriableError(f"schema registry unreachable: {exc}") from exc

    def encode(self, topic: str, ev: Mapping[str, Any], shape: Shape | None = None) -> bytes:
        """One event as a wire-format record (rows as plain values, or the producer's
        pre-encoded JSON fragments). ``shape``: the table's (types, key columns), for a
        control event written before any row of its table (a snapshot's start marker)."""
        schema_id, parsed, schema = self.schema_for(topic, ev, shape)
        try:
            plain = ev
            if any(isinstance(v, orjson.Fragment) for v in ev.values()):  # pg2kafka's rows
                plain = _from_fragments(ev, schema)
            datum = event_to_avro(plain, schema)
        except (ValueError, msgspec.DecodeError) as exc:
            from shared.errors import PermanentError

            raise PermanentError(
                f"a change of {ev['schema']}.{ev['table']} at LSN {ev['lsn']} cannot be"
                f" written in Avro: {exc}",
                hint="use producer.encoding=json for this table's topic",
            ) from exc
        out = io.BytesIO()
        out.write(_HEADER.pack(MAGIC, schema_id))
        fastavro.schemaless_writer(out, parsed, datum)
        return out.getvalue()


_decode_raw_row = msgspec.json.Decoder(dict[str, msgspec.Raw] | None).decode
_decode_raw_list = msgspec.json.Decoder(list[msgspec.Raw]).decode


def _from_fragments(ev: Mapping[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The event with pg2kafka's pre-encoded rows as values: a json / jsonb column (and
    its array elements) keeps its JSON text, exact; the others are parsed."""
    _, row_plan = _plans(schema)
    kinds = {column: (kind, is_array) for _, column, kind, is_array in row_plan}
    exact = any(kind == "j" for kind, _ in kinds.values())  # else: parsed whole
    out = dict(ev)
    for k in ("key", "new", "old"):
        v = ev.get(k)
        if not isinstance(v, orjson.Fragment):
            continue
        if not exact:
            out[k] = orjson.loads(orjson.dumps(v))
            continue
        raw_row = _decode_raw_row(orjson.dumps(v))
        if raw_row is None:
            out[k] = None
            continue
        row: dict[str, Any] = {}
        for column, raw in raw_row.items():
            kind, is_array = kinds.get(column, ("s", False))
            if kind != "j":
                row[column] = orjson.loads(bytes(raw))
            elif is_array and bytes(raw) != b"null":
                row[column] = _decode_raw_list(bytes(raw))
            else:
                row[column] = None if bytes(raw) == b"null" else raw
        out[k] = row
    for k in ("types", "ddl", "snapshot"):
        v = ev.get(k)
        if isinstance(v, orjson.Fragment):
            out[k] = orjson.loads(orjson.dumps(v))
    return out


class ConnectRegistryEncoder:
    """Kafka Connect records (the JSON converter's ``{"schema", "payload"}``: pg2kafka's
    Debezium keys and values) to Confluent wire-format Avro, as Confluent's AvroConverter
    writes them (:mod:`shared.formats.debezium_avro`). Each Connect schema is converted
    and registered once per subject (``<topic>-key`` / ``<topic>-value`` under the
    ``topic`` strategy); a changed one (a column added) is registered when first met,
    and the registry's compatibility rule decides. Thread-safe."""

    def __init__(self, client: Any, strategy: SubjectStrategy = "topic") -> None:
        self.client = client
        self.strategy = strategy
        self._walcast = RegistryEncoder(client, strategy)  # its registration rules
        self._ids: dict[tuple[str, str], tuple[int, Any]] = {}
        self._lock = threading.Lock()

    def encode(self, topic: str, record: Mapping[str, Any], key: bool = False) -> bytes:
        connect = record["schema"]
        text = orjson.dumps(connect, option=orjson.OPT_SORT_KEYS).decode()
        subj = subject(self.strategy, topic, str(connect.get("name") or "Connect"), key)
        found = self._ids.get((subj, text))
        if found is None:
            with self._lock:
                found = self._ids.get((subj, text))
                if found is None:
                    avro = avro_schema(connect)
                    schema_id = self._walcast._register(subj, orjson.dumps(avro).decode())
                    found = (schema_id, fastavro.parse_schema(avro))
                    self._ids[(subj, text)] = found
        out = io.BytesIO()
        out.write(_HEADER.pack(MAGIC, found[0]))
        fastavro.schemaless_writer(out, found[1], to_datum(connect, record["payload"]))
        return out.getvalue()


class RegistryDecoder:
    """Confluent wire-format records back to change events (JSON bytes the event
    contract decodes), each writer schema fetched from the registry once by its id."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._schemas: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._connect: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _schema(self, schema_id: int) -> tuple[Any, dict[str, Any]]:
        found = self._schemas.get(schema_id)
        if found is None:
            with self._lock:
                found = self._fetch(schema_id)
                self._schemas[schema_id] = found
        return found

    def _fetch(self, schema_id: int) -> tuple[Any, dict[str, Any]]:
        """A writer schema by id. Unknown to the registry, or no Avro record schema: the
        record is unreadable (dead-lettered); the registry unreachable or failing: a
        retriable error (the record is read again)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        from shared.errors import RetriableError

        try:
            text = self.client.get_schema(schema_id).schema_str
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise EventDecodeError(
                    f"schema id {schema_id} is unknown to the registry"
                ) from None
            raise RetriableError(f"schema registry: schema {schema_id}: {exc}") from exc
        except Exception as exc:  # the client's transport errors
            raise RetriableError(f"schema registry: schema {schema_id}: {exc}") from exc
        try:
            schema = orjson.loads(text or "")
            if not isinstance(schema, dict):
                raise ValueError("not a record schema")
            parsed = fastavro.parse_schema(schema)
        except Exception as exc:  # noqa: BLE001 - whatever the registry holds: unreadable
            raise EventDecodeError(
                f"schema {schema_id} is no Avro record schema"
                f" ({type(exc).__name__}: {limits.describe(exc)})"
            ) from None
        if limits.zero_width_avro_items(parsed):
            # A block of such items costs no bytes: a record could claim 2^63 of them.
            raise EventDecodeError(
                f"schema {schema_id} has an array or map of items that take no bytes"
                " (walcast does not read such records: their size is not bounded)"
            )
        return parsed, schema

    def decode(self, data: bytes) -> bytes:
        """A walcast event's JSON; or, for a Kafka Connect record (a Debezium key or
        value: its schema carries ``connect.name``), the JSON converter's record with its
        schema, which :mod:`shared.formats.debezium_input` reads.

        Total for the record: :class:`EventDecodeError` with the reason for anything it
        cannot read, whatever failed (the sinks dead-letter or quarantine it); only the
        registry unreachable (:class:`~shared.errors.RetriableError`) is raised as such."""
        try:
            return self._decode(data)
        except Exception as exc:
            if limits.passes(exc):
                raise
            raise limits.unreadable(exc, "Avro record") from None

    def _decode(self, data: bytes) -> bytes:
        schema_id, payload = unframe(data)
        parsed, schema = self._schema(schema_id)
        # A Connect record carries connect.name (its namespace may well start with
        # "walcast.": Debezium's default topic prefix here is "walcast").
        connect_record = "connect.name" in schema
        walcast = not connect_record and str(schema.get("namespace", "")).startswith("walcast.")
        if not walcast and not connect_record:
            raise EventDecodeError(
                f"Avro record of schema {schema_id} is neither a walcast change event nor a"
                " Kafka Connect record"
            )
        try:
            datum = fastavro.schemaless_reader(io.BytesIO(payload), parsed, None)
        except Exception as exc:  # noqa: BLE001 - whatever the bytes are: unreadable
            raise EventDecodeError(
                f"Avro record does not match schema {schema_id}"
                f" ({type(exc).__name__}: {limits.describe(exc)})"
            ) from None
        if not isinstance(datum, dict):
            raise EventDecodeError(f"Avro schema {schema_id} is not a record schema")
        if walcast:
            try:
                ev = event_from_avro(datum, schema)
            except KeyError as exc:
                raise EventDecodeError(
                    f"Avro schema {schema_id} is named as walcast's change event but lacks"
                    f" its field {exc.args[0]!r:.100}"
                ) from None
            return limits.dumps(ev)
        connect = self._connect.get(schema_id)
        if connect is None:
            connect = self._connect[schema_id] = connect_schema(schema)
        return limits.dumps({"schema": connect, "payload": from_datum(connect, datum)})


def registry_client(url: str, conf: Mapping[str, Any] | None = None) -> Any:
    """confluent-kafka's registry client (``mock://...``: its in-memory mock)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient.new_client({"url": url, **(conf or {})})


__all__ = [
    "RegistryDecoder",
    "RegistryEncoder",
    "event_from_avro",
    "event_schema",
    "event_to_avro",
    "frame",
    "record_name",
    "registry_client",
    "subject",
    "unframe",
]
