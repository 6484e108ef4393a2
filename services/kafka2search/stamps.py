"""What kafka2search writes into every document for ``verify``, in one place
(docs/design.md#verification, "What a sink stores"), and how a document changed by another
writer is recognised.

A document's ``_source`` starts with walcast's fields, in this order and this form::

    {"_walcast_hash":<hash>,"_walcast_xid":<xid>,"_walcast_body":<crc>,<the row's members>}

``_walcast_hash`` is absent when the row hash is unknown. ``_walcast_body`` is the CRC-32
of everything after it (from the comma on, or the closing brace of an empty row). The
engines keep a ``_source`` byte for byte as it was sent and give it back so; any other
writer of the document — an ``_update``, a document indexed again by hand, an update by
query — has the engine serialise the source anew, so the bytes after the stamp change
(the stamp is kept, with a CRC that no longer matches). That is what
:func:`body_intact` checks: a value changed inside the sink, which leaves the row hash as
it was, is seen without knowing anything about the value. A document indexed again whole
without walcast's fields has no hash either: verify reports it as of unknown hash, and
``repair`` reads it again. walcast's own rewrites of a document another writer changed
(a column renamed or dropped, a fill) keep its broken stamp, so they hide no edit.

The engine must keep sources as sent: an ingest pipeline that rewrites documents
(``index.default_pipeline`` / ``final_pipeline``), or a synthetic or filtered
``_source``, makes every document read as changed.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import msgspec
import orjson

from services.kafka2search.mapping import ROW_BODY
from shared.contract.event import ROW_HASH, ROW_XID

_OPEN = ord("{")
_QUOTE = ord('"')
_COMMA_CRC = zlib.crc32(b",")

_STAMP = re.compile(
    rb'\{(?:"%b":-?\d+,)?"%b":-?\d+,"%b":(\d+)'
    % (re.escape(ROW_HASH.encode()), re.escape(ROW_XID.encode()), re.escape(ROW_BODY.encode()))
)
_BODY_NAME = b'"%b"' % ROW_BODY.encode()


def stamped(
    row: bytes | memoryview | msgspec.Raw, row_hash: int | None, xid: int, body: int | None = None
) -> list[bytes | memoryview]:
    """The row's JSON object (its ``_source``, walcast's fields not in it) with the
    stamp first, as parts to join. A row whose first member follows its brace is not
    copied; one that does not (an empty object, whitespace) is rebuilt. ``body``: a stamp
    value kept instead of the CRC (a document another writer changed, rewritten by
    walcast, stays seen as changed)."""
    view = memoryview(row)
    if len(view) > 2 and view[0] == _OPEN and view[1] == _QUOTE:
        rest: bytes | memoryview = view[1:]
        crc = zlib.crc32(rest, _COMMA_CRC)
        comma = True
    else:
        inner = bytes(view).strip()[1:].lstrip()
        if inner[:1] == b"}":  # an empty row: the stamp closes it
            rest, comma = b"}", False
        else:
            rest, comma = inner, True
        crc = zlib.crc32(rest, _COMMA_CRC) if comma else zlib.crc32(rest)
    head = b"{" if row_hash is None else b'{"_walcast_hash":%d,' % row_hash
    value = crc if body is None else body
    stamp = b'%b"_walcast_xid":%d,"_walcast_body":%d%b' % (head, xid, value, b"," if comma else b"")
    return [stamp, rest]


def body_intact(source: bytes | memoryview) -> bool | None:
    """Whether a document's ``_source`` (its bytes as the engine returns them) is as
    kafka2search wrote it: True, False (another writer changed it), or None (written
    before documents carried a stamp: not known)."""
    raw = bytes(source)
    found = _STAMP.match(raw)
    if found is None:
        return False if _BODY_NAME in raw else None
    return zlib.crc32(memoryview(raw)[found.end() :]) == int(found.group(1))


def restamped(source: dict[str, Any], intact: bool | None = True) -> bytes:
    """A document's source rewritten by walcast (a column renamed or dropped), with its
    verify fields taken out and stamped anew (:mod:`services.kafka2search.stamps`): the
    rewrite is walcast's own, not another writer's. A source another writer had changed
    (``intact`` False) keeps its old, broken stamp: the rewrite does not hide the edit."""
    row_hash = source.pop(ROW_HASH, None)
    xid = source.pop(ROW_XID, None)
    body = source.pop(ROW_BODY, None)
    if not isinstance(xid, int):
        return orjson.dumps(source)
    known = row_hash if isinstance(row_hash, int) else None
    broken = body if intact is False and isinstance(body, int) else None
    return b"".join(stamped(orjson.dumps(source), known, xid, body=broken))


class _MgetDoc(msgspec.Struct):
    id: str = msgspec.field(name="_id")
    found: bool = False
    version: int = msgspec.field(name="_version", default=0)
    source: msgspec.Raw = msgspec.field(name="_source", default=msgspec.Raw(b""))


class _MgetAnswer(msgspec.Struct):
    docs: list[_MgetDoc] = []


_MGET = msgspec.json.Decoder(_MgetAnswer)
"""An ``_mget`` answer with each ``_source`` left as the bytes the engine sent."""


def mget_documents(raw: bytes) -> list[tuple[str, int, dict[str, Any], bool | None]]:
    """The documents an ``_mget`` found (its answer as the engine sent it): id, version,
    source parsed, and whether the source is as kafka2search wrote it."""
    return [
        (d.id, d.version, orjson.loads(memoryview(d.source)), body_intact(d.source))
        for d in _MGET.decode(raw).docs
        if d.found and len(d.source)
    ]


assert (ROW_HASH, ROW_XID) == ("_walcast_hash", "_walcast_xid")  # written out in stamped
