"""The type table against the server's own catalog: every OID, name and array OID."""

from __future__ import annotations

import psycopg

from shared.contract import pgtypes


def test_every_row_of_the_type_table_is_what_pg_type_says(stack_env: dict[str, str]) -> None:
    builtin = [t for t in pgtypes.TYPES if t.oid]
    with psycopg.connect(stack_env["WALCAST_PG_DSN"]) as conn:
        rows = conn.execute(
            "SELECT t.oid::int, t.typname, t.typarray::int, a.typname"
            " FROM pg_type t JOIN pg_type a ON a.oid = t.typarray"
            " WHERE t.oid = ANY(%s)",
            [[t.oid for t in builtin]],
        ).fetchall()
    catalog = {oid: (name, array_oid, array_name) for oid, name, array_oid, array_name in rows}
    for t in builtin:
        assert catalog.get(t.oid) == (t.name, t.array_oid, t.array_name), t
