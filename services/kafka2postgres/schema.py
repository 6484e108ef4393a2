"""A source table's schema as kafka2postgres builds the target table from it — from the
event's schema, never from the source's SQL text.

A DDL event carries the table's whole schema after the statement: each column's name,
``type`` (``pg_type.typname``), ``sql_type`` (``format_type()``: ``numeric(8,2)``,
``character varying(10)``, ``integer[]``) and ``num`` (its ``attnum``: renames are told
by it), and the key. A table the stream never described — one that existed before the
slot — is built from its first event: ``types`` (type names, without length or
precision: ``numeric``, ``varchar``) and the key's columns; its first DDL event brings the
exact types, and the target's columns are altered to them.

``sql_type`` comes from a Kafka record: it becomes part of a statement only after
:func:`check_sql_type` accepted it as a type name (identifiers, quoted identifiers,
digits in a type modifier, ``[]``) — nothing else can reach the SQL text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.contract.pgtypes import by_name

_IDENT = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
_SQL_TYPE = re.compile(
    rf"^(?:{_IDENT}\.)?{_IDENT}(?: [a-z]+)*(?:\(\d+(?:,\d+)?\))?(?: [a-z]+)*(?:\(\d+\))?(?:\[\])*$"
)
_PLAIN = re.compile(r"^[a-z_][a-z0-9_$]*$")


class SchemaError(ValueError):
    """An event's schema kafka2postgres cannot build a table from; the message says
    what and why."""


def check_sql_type(text: str, column: str) -> str:
    """``text`` if it is a type name as ``format_type()`` writes one; else
    :class:`SchemaError`."""
    if len(text) > 300 or not _SQL_TYPE.match(text):
        raise SchemaError(f"column {column!r}: {text[:80]!r} is not a Postgres type name")
    return text


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_WIDEST = {"bit": "varbit", "char": '"char"'}
"""Type names whose bare form is narrower than any of its values: ``bit`` alone is
``bit(1)``; a ``bit(3)`` value needs ``bit varying``. ``char`` unquoted is SQL's
``character(1)``, not the one-byte ``"char"``. (``bpchar``, ``varchar``,
``numeric`` and the times alone take any value of theirs.)"""


def sql_type_of(typname: str) -> str:
    """The SQL type of a column known only by its ``pg_type.typname`` (``_int4`` →
    ``int4[]``), wide enough for every value of it; quoted when it is no plain lower-case
    name."""
    base, array = (typname[1:], "[]") if typname.startswith("_") else (typname, "")
    if base in _WIDEST:
        return _WIDEST[base] + array
    return (base if _PLAIN.match(base) else quote_ident(base)) + array


ROW_ID = "_walcast_row_id"
"""The column kafka2postgres adds to the target of an insert-only (keyless) source table,
after the source's columns (columns added later come after it), as its primary key:
each row's ``append_only_id`` (shared/contract/event.py), the same on every redelivery —
so a row is held once, by the version guard every keyed row has (docs/kafka2postgres.md,
"Insert-only tables")."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # pg_type.typname as events carry it ("_int4" for int4[])
    sql_type: str  # checked by check_sql_type
    num: int | None = None  # attnum, when a DDL event said

    @property
    def kind(self) -> str:
        """How its values travel (shared/contract/pgtypes.py ``KINDS``; ``s`` for a type
        outside the table); an array's is its element's."""
        row, _ = by_name(self.type)
        return row.kind if row is not None else "s"

    @property
    def is_array(self) -> bool:
        return self.type.startswith("_")

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "sql_type": self.sql_type, "num": self.num}


@dataclass(frozen=True)
class TableSchema:
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    exact: bool  # from a DDL event (sql types with length and precision), not from types

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def numbers(self) -> dict[str, int]:
        return {c.name: c.num for c in self.columns if c.num is not None}

    @classmethod
    def from_ddl(cls, ddl: Mapping[str, Any]) -> TableSchema:
        """The schema a DDL event's ``columns`` and ``primary_key`` describe."""
        columns = []
        listed = ddl.get("columns") or []
        if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
            raise SchemaError("a schema whose columns are not a list of objects")
        for c in listed:
            name, typname = c.get("name"), c.get("type")
            if type(name) is not str or type(typname) is not str or not name:
                raise SchemaError("a DDL column without a name and a type")
            sql_type = c.get("sql_type")
            sql = (
                check_sql_type(sql_type, name)
                if isinstance(sql_type, str)
                else sql_type_of(typname)
            )
            num = c.get("num")
            columns.append(Column(name, typname, sql, num if type(num) is int else None))
        key = ddl.get("primary_key") or []
        if not isinstance(key, list) or not all(isinstance(k, str) for k in key):
            raise SchemaError("a DDL event whose primary_key is not a list of column names")
        names = {c.name for c in columns}
        if len(names) != len(columns):
            raise SchemaError("a DDL event naming a column twice")
        missing = [k for k in key if k not in names]
        if missing:
            raise SchemaError(f"key column(s) {missing} are not among the table's columns")
        return cls(tuple(columns), tuple(key), exact=True)

    @classmethod
    def from_types(cls, types: Mapping[str, str], key: list[str]) -> TableSchema:
        """The schema of a table known from a row event only: its ``types``, its key."""
        columns = tuple(Column(n, t, sql_type_of(t)) for n, t in types.items())
        missing = [k for k in key if k not in types]
        if missing:
            raise SchemaError(f"key column(s) {missing} are not among the row's columns")
        return cls(columns, tuple(key), exact=False)

    def with_columns(self, types: Mapping[str, str]) -> TableSchema:
        """This schema with the columns of ``types`` it lacks (a row that carries a
        column no DDL event announced: a source without DDL capture)."""
        extra = tuple(Column(n, t, sql_type_of(t)) for n, t in types.items() if n not in self.names)
        return TableSchema(self.columns + extra, self.key, self.exact) if extra else self

    @property
    def appended(self) -> bool:
        """The target of an insert-only table: keyed by :data:`ROW_ID`."""
        return self.key == (ROW_ID,)

    def with_row_id(self) -> TableSchema:
        """A keyless source table's schema as its target holds it: :data:`ROW_ID` last, as
        the key."""
        columns = tuple(c for c in self.columns if c.name != ROW_ID)
        return TableSchema((*columns, Column(ROW_ID, "text", "text")), (ROW_ID,), self.exact)

    def without_row_id(self) -> TableSchema:
        return TableSchema(tuple(c for c in self.columns if c.name != ROW_ID), (), self.exact)

    def as_json(self) -> list[dict[str, Any]]:
        return [c.as_json() for c in self.columns]

    @classmethod
    def from_json(cls, columns: list[dict[str, Any]], key: list[str], exact: bool) -> TableSchema:
        cols = tuple(
            Column(str(c["name"]), str(c["type"]), str(c["sql_type"]), c.get("num"))
            for c in columns
        )
        return cls(cols, tuple(key), exact)
