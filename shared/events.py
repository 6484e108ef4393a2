"""The walcast change event, version 1, and its JSON serializer.

One JSON object per change; the JSON Schema is ``shared/schemas/change_event.v1.json``
(docs: ``docs/events.md``). Producers build events as plain dicts in a fixed key order,
so encoding is deterministic: a redelivered change is byte-identical.

Fields (always present unless noted):

``v``            format version (1)
``op``           insert | update | delete | truncate | ddl | message | heartbeat
``db``           source database
``schema``, ``table``   source relation (absent for heartbeat / message)
``lsn``          LSN of this change (integer), the sinks' version; rows of one
                 multi-row insert share it
``seq``          position within the transaction: (commit_lsn, seq) identifies a change
``commit_lsn``   LSN where the transaction's commit record starts (integer)
``xid``          transaction id
``commit_ts``    commit time, ISO-8601 UTC with microseconds
``key``          identity columns → values (replica identity / primary key); {} if none
``new``          the row after (insert, update), else null
``old``          the row before where replica identity provides it (update with FULL or
                 a changed key, delete), else null
``unchanged_toast``  columns of ``new`` the server did not send because a TOASTed value
                 was not modified: absent from ``new``; sinks must keep the stored value
``types``        column → Postgres type name
"""

from __future__ import annotations

from typing import Any

import orjson

from shared.interfaces import Serializer

EVENT_VERSION = 1
OPERATIONS = frozenset({"insert", "update", "delete", "truncate", "ddl", "message", "heartbeat"})

Event = dict[str, Any]


class EventDecodeError(ValueError):
    """Bytes that are not a walcast change event this code understands."""


class JsonEventSerializer(Serializer[Event]):
    """orjson, UTF-8, no whitespace; ``decode`` checks the format version and operation."""

    def encode(self, item: Event) -> bytes:
        return orjson.dumps(item)

    def decode(self, data: bytes) -> Event:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise EventDecodeError(f"not JSON: {exc}") from exc
        if not isinstance(event, dict):
            raise EventDecodeError("not a JSON object")
        if event.get("v") != EVENT_VERSION:
            raise EventDecodeError(f"unknown event version {event.get('v')!r}")
        if event.get("op") not in OPERATIONS:
            raise EventDecodeError(f"unknown operation {event.get('op')!r}")
        return event
