"""The local stack's Postgres is fit for logical replication with pgoutput."""

from __future__ import annotations

import psycopg
import pytest


@pytest.fixture
def conn(stack_env: dict[str, str]) -> psycopg.Connection[tuple[object, ...]]:
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as c:
        yield c


def test_wal_level_and_replication_role(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
    row = conn.execute(
        "SELECT rolreplication FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    assert row == (True,)
    slots = conn.execute("SHOW max_replication_slots").fetchone()
    assert slots is not None
    assert int(str(slots[0])) >= 10


def test_pgoutput_slot_decodes_a_committed_insert(
    conn: psycopg.Connection[tuple[object, ...]], unique_name: str
) -> None:
    table, pub, slot = f"{unique_name}_t", f"{unique_name}_p", f"{unique_name}_s"
    conn.execute(f'CREATE TABLE "{table}" (id int primary key, note text)')
    conn.execute(f'CREATE PUBLICATION "{pub}" FOR TABLE "{table}"')
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    try:
        conn.execute(f"INSERT INTO \"{table}\" VALUES (1, 'hello walcast')")
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s)",
            [slot, pub],
        ).fetchall()
        kinds = [bytes(r[0])[:1] for r in rows]
        assert kinds == [b"B", b"R", b"I", b"C"]  # begin, relation, insert, commit
        assert b"hello walcast" in bytes(rows[2][0])
    finally:
        conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
        conn.execute(f'DROP PUBLICATION "{pub}"')
        conn.execute(f'DROP TABLE "{table}"')


def test_replication_connection_identifies_system(stack_env: dict[str, str]) -> None:
    with psycopg.connect(
        stack_env["WALCAST_PG_DSN"], autocommit=True, replication="database"
    ) as rep:
        cur = rep.cursor()
        cur.execute("IDENTIFY_SYSTEM", prepare=False)
        row = cur.fetchone()
        assert row is not None
        assert row[3] == stack_env["WALCAST_PG_DATABASE"]
