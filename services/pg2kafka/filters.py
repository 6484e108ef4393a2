"""Table filters: include / exclude patterns ``schema.table`` where ``*`` matches anything.

The same rules run in two places: in SQL (``_walcast.table_matches``, used by ``init`` and
by the DDL event trigger to keep the publication in step) and here, on every event, as the
last word — so a table outside the filters never reaches Kafka even when the publication
is ``FOR ALL TABLES`` or a DDL message mentions it. pg2kafka's own schema is always out.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from shared.naming import wildcard

INTERNAL_SCHEMA = "_walcast"


def split_pattern(pattern: str) -> tuple[str, str]:
    schema, sep, table = pattern.partition(".")
    if not sep or not schema or not table:
        raise ValueError(f"filter {pattern!r} must look like schema.table (with * wildcards)")
    return schema, table


class TableFilter:
    def __init__(self, include: Sequence[str], exclude: Sequence[str]) -> None:
        self.include = [tuple(map(wildcard, split_pattern(p))) for p in include]
        self.exclude = [tuple(map(wildcard, split_pattern(p))) for p in exclude]
        self._cached = lru_cache(maxsize=4096)(self._match)

    def matches(self, schema: str, table: str) -> bool:
        return self._cached(schema, table)

    def _match(self, schema: str, table: str) -> bool:
        if schema == INTERNAL_SCHEMA:
            return False
        if not any(s.match(schema) and t.match(table) for s, t in self.include):
            return False
        return not any(s.match(schema) and t.match(table) for s, t in self.exclude)
