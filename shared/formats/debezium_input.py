"""Debezium records as walcast change events: how kafka2search and kafka2spark read topics
written by the Debezium PostgreSQL connector (or pg2kafka's ``debezium`` format).

:func:`translate` turns one record (the Kafka key and value, Kafka Connect's JSON
converter with schemas) into the change events walcast's sinks already apply, which
then pass the event contract's own checks (:func:`shared.contract.event.decode`). The
sinks' consumer setting ``input_format`` (``walcast``, ``debezium``, ``auto``) chooses;
:func:`is_debezium` is how ``auto`` tells the two apart, record by record.

The mapping (docs/events.md, "Reading Debezium topics"):

- ``op`` ``c`` / ``r`` / ``u`` / ``d`` / ``t`` → ``insert`` / ``read`` / ``update`` /
  ``delete`` / ``truncate``; a logical-decoding message (``m``) and a tombstone (a record
  without a value) carry no row change: no event — except pg2kafka's verification
  marker (an ``m`` record with ``source.walcast_mark``), which becomes ``verify``, and
  the end of its incremental snapshot of a table (``source.walcast_snapshot``), which
  becomes walcast's ``snapshot`` end marker.
- ``source.walcast_hash`` (pg2kafka's records; not the connector's) is the event's row
  hash, which ``verify`` compares; a row without it is of unknown hash (read again).
- Values go back to walcast's encoding through the Connect field schemas
  (:func:`shared.formats.debezium.to_walcast`) and ``types`` names each column's
  Postgres type (:func:`~shared.formats.debezium.pg_type`). A record without its schema
  (the converter's ``schemas.enable=false``) is refused: its numbers, dates and bytes
  cannot be read without one.
- The version sinks compare is ``source.lsn``: the change's own position. A snapshot's
  row (``r``) is versioned one below its ``source.lsn``. pg2kafka writes there the
  slot's restart position, below every change streamed after the snapshot; the real
  connector writes its slot's consistent point, and a transaction that began before that
  point and committed after it has changes below it — such a change, arriving after the
  row, is refused as older (docs/events.md states this limit).
- ``key``: the Kafka key's columns; a table without a key (REPLICA IDENTITY FULL and no
  primary key: the connector writes no key) is keyed by its whole row, as walcast's own
  events are — so an update of such a row is a delete of the old row and an insert of
  the new one.
- An unchanged TOAST value (Debezium's placeholder) is left out of the row and listed
  in ``unchanged_toast``: the sinks keep what they hold.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from shared.contract import limits
from shared.contract.event import EVENT_VERSION, MAX_LSN, MAX_ROW_HASH, EventDecodeError
from shared.formats.debezium import (
    MARK_OP,
    UNAVAILABLE,
    WALCAST_HASH,
    WALCAST_MARK,
    WALCAST_SNAPSHOT,
    pg_type,
    to_walcast,
)

InputFormat = Literal["walcast", "debezium", "auto"]
"""What a sink's topics hold: walcast's change events, Debezium records, or either
(told apart per record by :func:`is_debezium`)."""

_OPS = {"c": "insert", "r": "read", "u": "update", "d": "delete", "t": "truncate"}
_UNAVAILABLE_BYTES = base64.b64encode(UNAVAILABLE.encode()).decode()
_UNAVAILABLE_INTS = list(UNAVAILABLE.encode())
_SCHEMALESS = (
    "a Debezium record without its schema (the JSON converter's schemas.enable=false):"
    " its numbers, dates and bytes cannot be read without the column types; set"
    " value.converter.schemas.enable=true (and key.converter.schemas.enable=true) on the"
    " connector"
)


def is_debezium(value: bytes | None) -> bool:
    """Whether a record is Debezium's rather than a walcast event: a tombstone, or a JSON
    object that does not start with walcast's ``"v"`` field (which pg2kafka always
    writes first)."""
    return value is None or not value.startswith(b'{"v":')


def translate(key: bytes | None, value: bytes | None) -> list[bytes]:
    """The walcast change events (encoded) of one Debezium record, in the order to apply
    them; none for a tombstone or a message. Total: :class:`EventDecodeError` with the
    reason for a record that cannot be read, whatever went wrong (the sinks dead-letter
    or quarantine it); sizes and depths are bounded (:mod:`shared.contract.limits`)."""
    evs = events(key, value)
    try:
        return [limits.dumps(ev) for ev in evs]
    except Exception as exc:
        if limits.passes(exc):
            raise
        raise limits.unreadable(exc, "Debezium record") from None


def events(key: bytes | None, value: bytes | None) -> list[dict[str, Any]]:
    """:func:`translate`, as dicts (total as it is)."""
    try:
        return _events(key, value)
    except Exception as exc:
        # Shapes no rule above foresaw (a timestamp out of range, a malformed schema):
        # unreadable, like any other malformed record, never a stop of the sink.
        if limits.passes(exc):
            raise
        raise limits.unreadable(exc, "Debezium record") from None


def _events(key: bytes | None, value: bytes | None) -> list[dict[str, Any]]:
    if value is None:
        return []  # a tombstone: for log compaction, after the delete it follows
    record = _json(value, "value")
    if not isinstance(record, dict):
        raise EventDecodeError("not a JSON object")
    payload, schema = record.get("payload"), record.get("schema")
    if "payload" not in record:
        if "op" in record and "source" in record:
            raise EventDecodeError(_SCHEMALESS)
        raise EventDecodeError("not a Debezium change record (no schema and payload)")
    if not isinstance(payload, dict) or not isinstance(schema, dict):
        raise EventDecodeError(
            _SCHEMALESS if isinstance(payload, dict) and schema is None
            else "Debezium record: schema or payload is not an object"
        )  # fmt: skip
    op = payload.get("op")
    if op == MARK_OP:
        return _mark(payload)
    if op not in _OPS:
        raise EventDecodeError(f"Debezium record with an unknown op {op!r}")
    head = _head(payload)
    row_hash = _row_hash(payload)
    if op == "t":
        return [{**head, "op": "truncate", "key": {}, "new": None, "old": None}]
    fields = _row_fields(schema)
    before = _row(payload.get("before"), fields, "before")
    after = _row(payload.get("after"), fields, "after")
    types = {name: pg_type(f) for name, f in fields.items()}
    names = _key_names(key)
    if op == "d":
        if before is None:
            raise EventDecodeError("Debezium delete without a before image")
        return [_event(head, "delete", _key(names, before[0]), None, types)]
    if after is None:
        raise EventDecodeError(f"Debezium {_OPS[op]} without an after image")
    if op == "r":
        head["lsn"] = head["commit_lsn"] = max(head["lsn"] - 1, 0)
    if names is None and before is not None and after[1]:
        # Keyed by the whole row, the key must be whole: an unchanged TOAST value is
        # taken from the before image (complete under REPLICA IDENTITY FULL).
        missing = [c for c in after[1] if c not in before[0]]
        if missing:
            raise EventDecodeError(
                f"Debezium update of a table without a key: unchanged TOAST column(s)"
                f" {missing} are in neither image"
            )
        after = ({**after[0], **{c: before[0][c] for c in after[1]}}, [])
    if names is None and op == "u" and before is not None and before[0] != after[0]:
        # Keyed by its whole row, the row moved to another key.
        return [
            _event(head, "delete", before[0], None, types),
            {**_event(head, "insert", after[0], after, types), "seq": 1},
        ]
    ev = _event(head, _OPS[op], _key(names, after[0]), after, types)
    if row_hash is not None and not after[1]:
        ev["hash"] = row_hash
    return [ev]


def _row_hash(payload: dict[str, Any]) -> int | None:
    """``source.walcast_hash`` (pg2kafka's records; the connector writes none)."""
    h = payload["source"].get(WALCAST_HASH)
    if h is None:
        return None
    if type(h) is not int or not 0 <= h <= MAX_ROW_HASH:
        raise EventDecodeError(f"Debezium source.{WALCAST_HASH} not an integer from 0 to 2^32-1")
    return h


def _mark(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """An ``m`` record: pg2kafka's verification marker (``source.walcast_mark``) as
    walcast's ``verify`` event, the end of its incremental snapshot of a table
    (``source.walcast_snapshot``) as walcast's ``snapshot`` marker (at ``source.lsn``, the
    snapshot's start version: the event contract checks its block); any other
    logical-decoding message carries nothing."""
    source = payload.get("source")
    mark = source.get(WALCAST_MARK) if isinstance(source, dict) else None
    end = source.get(WALCAST_SNAPSHOT) if isinstance(source, dict) else None
    if end is not None:
        info = _json(str(end).encode(), f"source.{WALCAST_SNAPSHOT}")
        if not isinstance(info, dict):
            raise EventDecodeError(f"Debezium source.{WALCAST_SNAPSHOT} is not a JSON object")
        return [{**_head(payload), "op": "snapshot", "key": {}, "new": None, "old": None,
                 "snapshot": info}]  # fmt: skip
    if mark is None:
        return []
    head = _head(payload)
    return [{**head, "op": "verify", "key": {}, "new": None, "old": None,
             "verify": {"id": mark}}]  # fmt: skip


_Image = tuple[dict[str, Any], list[str]]  # the row, its unchanged TOAST columns


def _json(data: bytes, what: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError(f"not JSON ({what}): {exc}") from None


def _head(payload: dict[str, Any]) -> dict[str, Any]:
    source = payload.get("source")
    if not isinstance(source, dict):
        raise EventDecodeError("Debezium record without a source block")
    for name in ("db", "schema", "table"):
        if type(source.get(name)) is not str:
            raise EventDecodeError(f"Debezium source.{name} missing or not a string")
    lsn = source.get("lsn")
    if type(lsn) is not int or not 0 <= lsn <= MAX_LSN:
        raise EventDecodeError("Debezium source.lsn missing or not an integer from 0 to 2^63-1")
    xid = source.get("txId")
    us = source.get("ts_us")
    if type(us) is not int:
        ms = source.get("ts_ms")
        us = ms * 1000 if type(ms) is int else 0
    return {
        "v": EVENT_VERSION,
        "op": "",
        "db": source["db"],
        "schema": source["schema"],
        "table": source["table"],
        "lsn": lsn,
        "seq": 0,
        "commit_lsn": lsn,
        "xid": xid if type(xid) is int else 0,
        "commit_ts": datetime.fromtimestamp(us / 1_000_000, tz=UTC).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ"
        ),
    }


def _row_fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The row's Connect field schemas, by column, from the envelope's ``after`` (or
    ``before``) field."""
    for envelope_field in schema.get("fields") or ():
        if isinstance(envelope_field, dict) and envelope_field.get("field") in ("after", "before"):
            columns = envelope_field.get("fields")
            if isinstance(columns, list):
                return {str(f["field"]): f for f in columns if isinstance(f, dict) and "field" in f}
    raise EventDecodeError("Debezium schema without the row's fields (no before / after)")


def _row(image: Any, fields: dict[str, dict[str, Any]], what: str) -> _Image | None:
    if image is None:
        return None
    if not isinstance(image, dict):
        raise EventDecodeError(f"Debezium {what} is not an object")
    row: dict[str, Any] = {}
    toast: list[str] = []
    for name, value in image.items():
        if _unchanged(value, fields.get(name)):
            toast.append(name)
            continue
        field = fields.get(name)
        if field is None:
            raise EventDecodeError(f"Debezium {what} column {name!r} is not in its schema")
        try:
            row[name] = to_walcast(field, value)
        except Exception as exc:
            if limits.passes(exc):
                raise
            kind = field.get("name") or field.get("type")
            detail = exc if isinstance(exc, EventDecodeError) else limits.describe(exc)
            raise EventDecodeError(
                f"Debezium {what} column {name!r:.100}: {_excerpt(value)} is not a"
                f" {kind!s:.100} value ({detail})"
            ) from None
    return row, toast


def _excerpt(value: Any) -> str:
    """The start of a value's repr, without building the whole of a large one."""
    if isinstance(value, (str, bytes)) and len(value) > 100:
        value = value[:100]
    elif isinstance(value, (list, dict)) and len(value) > 10:
        return f"a {type(value).__name__} of {len(value)} items"
    try:
        text = repr(value)
    except RecursionError:
        return "a deeply nested value"
    return text if len(text) <= 100 else text[:99] + "…"


def _unchanged(value: Any, field: dict[str, Any] | None) -> bool:
    """Whether a value is the connector's placeholder for an unchanged TOAST value: the
    text, its bytes (base64) in a bytea column, an array of it, or its bytes as an
    integer array."""
    if isinstance(value, str):
        if value == UNAVAILABLE:
            return True
        is_bytes = field is not None and field.get("type") == "bytes" and "name" not in field
        return is_bytes and value == _UNAVAILABLE_BYTES
    return isinstance(value, list) and value in ([UNAVAILABLE], _UNAVAILABLE_INTS)


def _key_names(key: bytes | None) -> list[str] | None:
    """The key's columns; None for a record without a key."""
    if key is None:
        return None
    parsed = _json(key, "key")
    if isinstance(parsed, dict) and "payload" in parsed and "schema" in parsed:
        parsed = parsed["payload"]
    if not isinstance(parsed, dict) or not parsed:
        raise EventDecodeError("Debezium key is not a struct of the key's columns")
    return list(parsed)


def _key(names: list[str] | None, row: dict[str, Any]) -> dict[str, Any]:
    if names is None:
        return row
    missing = [n for n in names if n not in row]
    if missing:
        raise EventDecodeError(f"Debezium key column(s) {missing} not in the row")
    return {n: row[n] for n in names}


def _event(
    head: dict[str, Any], op: str, key: dict[str, Any], image: _Image | None,
    types: dict[str, str],
) -> dict[str, Any]:  # fmt: skip
    ev = {**head, "op": op, "key": key, "new": image[0] if image else None, "types": types}
    if image is not None and image[1]:
        ev["unchanged_toast"] = image[1]
    return ev
