"""Postgres text output → JSON values, by type OID: which conversion each type gets.

The built-in types and their kinds are the one type table,
:mod:`shared.contract.pgtypes`; the kinds are implemented in the compiled per-event path
(:mod:`services.pg2kafka._native`). Types outside the table (enums, domains, arrays of
those, extension types) are looked up once (``TypeInfo`` via a callback that queries
``pg_type``) and cached by OID: domains convert as their base type, arrays element-wise,
anything else travels as its text output.

A column's conversion is a *spec*: a kind (``"i"``), or for an array ``"a"`` + the
element delimiter + the element's spec (``"a,i"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from services.pg2kafka._native import convert_value
from shared.contract import pgtypes
from shared.contract.pgtypes import TEXT_KIND


def array_spec(element: str, delimiter: str = ",") -> str:
    """The spec of an array of ``element``. A delimiter that is not one ASCII character
    (no built-in type has one) leaves the array as its text."""
    if len(delimiter) != 1 or not delimiter.isascii():
        return TEXT_KIND
    return "a" + delimiter + element


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """What ``pg_type`` says about a type walcast does not know by OID."""

    oid: int
    name: str
    kind: str  # pg_type.typtype: b base, d domain, e enum, c composite, r range, m multirange
    base_oid: int  # for domains (typbasetype), else 0
    element_oid: int  # for arrays (typelem when typcategory = 'A'), else 0
    delimiter: str = ","


TypeLookup = Callable[[int], TypeInfo | None]


class TypeRegistry:
    """Finds the conversion spec for a type OID; unknown OIDs are asked of ``lookup`` once."""

    def __init__(self, lookup: TypeLookup | None = None) -> None:
        self._lookup = lookup
        self._cache: dict[int, str] = {t.oid: t.kind for t in pgtypes.TYPES if t.oid}
        for arr, elem in pgtypes.ELEMENT_OF.items():
            self._cache[arr] = array_spec(elem.kind)
        self._names: dict[int, str] = {}

    def spec(self, oid: int) -> str:
        found = self._cache.get(oid)
        if found is None:
            found = self._resolve(oid, depth=0)
            self._cache[oid] = found
        return found

    def convert(self, oid: int, value: str) -> Any:
        """One value as the event carries it, parsed back (for tests and tools; the stream
        converts whole rows: :class:`~services.pg2kafka._native.RowEncoder`). ValueError
        when it does not convert."""
        return orjson.loads(convert_value(self.spec(oid), value))

    def name(self, oid: int) -> str:
        """The column's type as events carry it: ``pg_type.typname`` (built-ins from the
        table, others from the server, asked once); the OID as text only when the server
        does not know it either."""
        known = pgtypes.builtin_name(oid) or self._names.get(oid)
        if known is not None:
            return known
        if self._lookup is not None:
            info = self._lookup(oid)
            if info is not None:
                self._names[oid] = info.name
                return info.name
        return str(oid)

    def named(self, oid: int, name: str) -> None:
        """A Type message announced ``oid``'s name (and maybe a change): forget what was
        cached for it."""
        self._names[oid] = name
        if pgtypes.builtin_name(oid) is None:
            self._cache.pop(oid, None)

    def _resolve(self, oid: int, depth: int) -> str:
        if depth > 8 or self._lookup is None:
            return TEXT_KIND
        if oid in self._cache:
            return self._cache[oid]
        info = self._lookup(oid)
        if info is None:
            return TEXT_KIND
        self._names[oid] = info.name
        if info.element_oid:
            return array_spec(self._resolve(info.element_oid, depth + 1), info.delimiter)
        if info.kind == "d" and info.base_oid:
            return self._resolve(info.base_oid, depth + 1)
        return TEXT_KIND  # enums, ranges, composites, extension types: their text output
