"""From Postgres tables to search indices: names, field mappings, document ids.

Contract (documented in docs/kafka2search.md):

* One index per source table. Readers use an alias (``index.name_template``); the index
  behind it is ``<alias>-v1``, so a later reindex into ``-v2`` is one alias swap.
* Fields are mapped from the Postgres column types carried by every event (and by DDL
  events, before the data of a new column arrives), by the one type table
  (:mod:`shared.contract.pgtypes`). ``dynamic: false``: a field walcast
  did not map is kept in ``_source`` but never guessed at. Two of walcast's own fields,
  :data:`VERIFY_FIELDS`, are in every document and mapped in every index.
* Document id = the identity values (:func:`document_id`, the one place an id is made):
  a single column's value as text; several columns as a JSON array (so ``("a,b", "c")``
  and ``("a", "b,c")`` never meet). Ids longer than the engine's 512-byte limit become
  ``sha256:<hex>`` of that text — and so does a text that itself starts with
  ``sha256:``, whatever its length: no key's plain text can take the id of another
  key's hash.
* A row of an insert-only table (``append_only``: no key) is indexed under
  ``append-only:<row id>`` (:data:`APPEND_ONLY`, the contract's
  :func:`~shared.contract.event.append_only_id`: the same on every redelivery, different
  for every row). A key's text that starts with that prefix is hashed like one starting
  with ``sha256:``, so no keyed document of the same index (a table that gains a key)
  can take an append-only document's id: a row id alone (``<version>.<seq>``) would be
  the plain id of a numeric key such as ``1.5``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any

from shared.contract import limits, pgtypes
from shared.contract.event import ROW_HASH, ROW_XID
from shared.contract.keyorder import TIME_KEY_TYPES
from shared.naming import SEARCH_INDEX, table_name

MAX_ID_BYTES = 512


def field_mapping(pg_type: str) -> Mapping[str, Any]:
    """The mapping of one column (``pg_type`` as events carry it), from the one type table
    (:mod:`shared.contract.pgtypes`): arrays map like their elements (engines index arrays
    of any field); enums, ranges, unknown types: keyword."""
    return pgtypes.search_mapping(pg_type)


ROW_BODY = "_walcast_body"
"""The CRC-32 of the rest of the document as kafka2search wrote it
(:mod:`services.kafka2search.stamps`): read from ``_source`` only, so neither indexed nor
kept as doc values."""

VERIFY_FIELDS: dict[str, Mapping[str, Any]] = {
    ROW_HASH: {"type": "long"},
    ROW_XID: {"type": "long"},
    ROW_BODY: {"type": "long", "index": False, "doc_values": False},
}
"""The fields ``verify`` aggregates and reads (docs/design.md#verification), mapped in
every index (added to an index made before them when it is opened)."""


def properties(
    types: Mapping[str, str], keys: Collection[str] = ()
) -> dict[str, Mapping[str, Any]]:
    """The mapping of columns ``types``; a text column of the key (``keys``) keeps values
    of any length in its keyword, a date or timestamp one its text (:data:`KEY_TEXT`):
    what ``verify`` and key ranges compare them by."""
    return {
        column: _key_mapping(field_mapping(t), t) if column in keys else field_mapping(t)
        for column, t in types.items()
    }


def _key_mapping(m: Mapping[str, Any], pg_type: str) -> Mapping[str, Any]:
    if pg_type in TIME_KEY_TYPES:
        fields = {**m.get("fields", {}), KEY_TEXT: {"type": "keyword"}}
        return {**m, "fields": fields}
    return _long_keyword(m)


def _long_keyword(m: Mapping[str, Any]) -> Mapping[str, Any]:
    sub = m.get("fields", {}).get("keyword")
    if m.get("type") != "text" or sub is None:
        return m
    return {**m, "fields": {**m["fields"], "keyword": {**sub, "ignore_above": KEY_KEYWORD_CHARS}}}


KEY_KEYWORD_CHARS = 8191
"""The longest text key a keyword holds (Lucene's term limit, 32,766 bytes, in 4-byte
characters; shared/contract/keyranges.py's bound)."""


def key_field(column: str, pg_type: str) -> str:
    """The field a key column is compared, sorted and read by: the keyword of a column
    mapped as text (code point order, as Postgres with ``COLLATE "C"``), the raw text of
    a date or timestamp (:data:`KEY_TEXT`: a ``date`` field keeps milliseconds), else
    itself."""
    if pg_type in TIME_KEY_TYPES:
        return f"{column}.{KEY_TEXT}"
    m = field_mapping(pg_type)
    return (
        f"{column}.keyword"
        if m.get("type") == "text" and "keyword" in m.get("fields", {})
        else column
    )


KEY_TEXT = "key"
"""The keyword beside a date or timestamp key column's ``date`` field, holding the value's
text as the event carries it (:func:`shared.contract.keyorder.key_text`), whose code
point order is Postgres's: what ``verify`` and key ranges compare such a key by. Mapped
when the column is mapped as a key (an index made before has none: its table is not
verified, :func:`has_key_fields`)."""


def has_key_fields(props: Mapping[str, Any], keys: Mapping[str, str]) -> list[str]:
    """The key columns (``keys``: name → type) whose :func:`key_field` the index's mapping
    ``props`` lacks."""
    out = []
    for column, pg_type in keys.items():
        field = key_field(column, pg_type)
        m = props.get(column, {})
        if field != column and field.split(".", 1)[1] not in m.get("fields", {}):
            out.append(column)
    return out


def alias_name(template: str, db: str, schema: str, table: str) -> str:
    """The alias of a table's index: the template filled, lower-cased, and collision-free
    (:func:`shared.naming.table_name`: a name that had to change gets a hash suffix)."""
    return table_name(template, SEARCH_INDEX, db, schema, table)


def index_name(alias: str, version: int = 1) -> str:
    return f"{alias}-v{version}"


HASHED = "sha256:"
"""The prefix of a hashed id. A key's text that starts with it is hashed too: the ids
that start with it are hashes, all others are keys' texts as they are, so two different
keys never share an id (short of a SHA-256 collision). Ids of every other key are what
they were before this rule (existing indices keep matching)."""

APPEND_ONLY = "append-only:"
"""The prefix of an append-only row's id (:func:`document_id` with ``row_id``). A key's
text starting with it is hashed (as one starting with :data:`HASHED`): ids starting with
it are rows of insert-only tables, never a key's text."""


def document_id(key: dict[str, Any], row_id: str | None = None) -> str | None:
    """A change's document id (see the module doc); None for a change without identity
    (it cannot be addressed in the index). ``row_id``: the event's
    :meth:`~shared.contract.event.EventView.row_id` (a row of an insert-only table), which
    is then the id, after :data:`APPEND_ONLY`, whatever the key. Called once per record:
    the only place an id is computed. :class:`~shared.contract.event.EventDecodeError`
    for a key that cannot be written as text (nested deeper than walcast's limit, an
    integer beyond 64 bits in a composite key)."""
    if row_id is not None:
        return APPEND_ONLY + row_id
    if not key:
        return None
    if len(key) == 1:
        (v,) = key.values()
        if type(v) is str:
            text = v
        elif type(v) is int:  # the common key, without a JSON round trip
            text = str(v) if -(2**63) <= v < 2**64 else limits.dumps(v).decode()
        else:
            text = limits.dumps(v).decode()
    else:
        text = limits.dumps(list(key.values())).decode()
    # A character is at most 4 bytes in UTF-8: most ids need no encoding to be measured.
    if (len(text) <= MAX_ID_BYTES // 4 or len(text.encode()) <= MAX_ID_BYTES) and not (
        text.startswith((HASHED, APPEND_ONLY))
    ):
        return text
    return HASHED + hashlib.sha256(text.encode()).hexdigest()
