"""Postgres text output → JSON values, by type OID.

The built-in types and their converters are the one type table,
:mod:`shared.contract.pgtypes`. Types outside it (enums, domains, arrays of those,
extension types) are looked up once (``TypeInfo`` via a callback that queries
``pg_type``) and cached by OID: domains convert as their base type, arrays element-wise,
anything else travels as its text output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.contract import pgtypes
from shared.contract.pgtypes import Converter, array_of

text_converter: Converter = pgtypes.text  # callers may skip calling it: the text is the value


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
    """Finds the converter for a type OID; unknown OIDs are asked of ``lookup`` once."""

    def __init__(self, lookup: TypeLookup | None = None) -> None:
        self._lookup = lookup
        self._cache: dict[int, Converter] = {t.oid: t.convert for t in pgtypes.TYPES if t.oid}
        for arr, elem in pgtypes.ELEMENT_OF.items():
            self._cache[arr] = array_of(elem.convert)
        self._names: dict[int, str] = {}

    def converter(self, oid: int) -> Converter:
        conv = self._cache.get(oid)
        if conv is None:
            conv = self._resolve(oid, depth=0)
            self._cache[oid] = conv
        return conv

    def convert(self, oid: int, value: str) -> Any:
        return self.converter(oid)(value)

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

    def _resolve(self, oid: int, depth: int) -> Converter:
        if depth > 8 or self._lookup is None:
            return text_converter
        if oid in self._cache:
            return self._cache[oid]
        info = self._lookup(oid)
        if info is None:
            return text_converter
        self._names[oid] = info.name
        if info.element_oid:
            elem = self._resolve(info.element_oid, depth + 1)
            return array_of(elem, info.delimiter)
        if info.kind == "d" and info.base_oid:
            return self._resolve(info.base_oid, depth + 1)
        return text_converter  # enums, ranges, composites, extension types: their text output
