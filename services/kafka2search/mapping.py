"""From Postgres tables to search indices: names, field mappings, document ids.

Contract (documented in docs/kafka2search.md):

* One index per source table. Readers use an alias (``index.name_template``); the index
  behind it is ``<alias>-v1``, so a later reindex into ``-v2`` is one alias swap.
* Fields are mapped from the Postgres column types carried by every event (and by DDL
  events, before the data of a new column arrives), by the one type table
  (:mod:`shared.contract.pgtypes`). ``dynamic: false``: a field walcast
  did not map is kept in ``_source`` but never guessed at.
* Document id = the identity values: a single column's value as text; several columns as
  a JSON array (so ``("a,b", "c")`` and ``("a", "b,c")`` never meet); ids longer than the
  engine's 512-byte limit become ``sha256:<hex>`` of that text.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from shared.contract import pgtypes
from shared.naming import SEARCH_INDEX, table_name

MAX_ID_BYTES = 512


def field_mapping(pg_type: str) -> Mapping[str, Any]:
    """The mapping of one column (``pg_type`` as events carry it), from the one type table
    (:mod:`shared.contract.pgtypes`): arrays map like their elements (engines index arrays
    of any field); enums, ranges, unknown types: keyword."""
    return pgtypes.search_mapping(pg_type)


def properties(types: Mapping[str, str]) -> dict[str, Mapping[str, Any]]:
    return {column: field_mapping(t) for column, t in types.items()}


def alias_name(template: str, db: str, schema: str, table: str) -> str:
    """The alias of a table's index: the template filled, lower-cased, and collision-free
    (:func:`shared.naming.table_name`: a name that had to change gets a hash suffix)."""
    return table_name(template, SEARCH_INDEX, db, schema, table)


def index_name(alias: str, version: int = 1) -> str:
    return f"{alias}-v{version}"


def document_id(key: dict[str, Any]) -> str | None:
    """None for a change without identity (it cannot be addressed in the index)."""
    if not key:
        return None
    if len(key) == 1:
        (v,) = key.values()
        if type(v) is str:
            text = v
        elif type(v) is int:  # the common key, without a JSON round trip
            text = str(v)
        else:
            text = orjson.dumps(v).decode()
    else:
        text = orjson.dumps(list(key.values())).decode()
    # A character is at most 4 bytes in UTF-8: most ids need no encoding to be measured.
    if len(text) <= MAX_ID_BYTES // 4 or len(text.encode()) <= MAX_ID_BYTES:
        return text
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
