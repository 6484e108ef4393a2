"""The local stack's optional Debezium component: a Kafka Connect worker whose Debezium
PostgreSQL connector captures a table's changes into ``<prefix>.<schema>.<table>``."""

from __future__ import annotations

import psycopg

from tests import debezium


def test_debezium_captures_inserts_updates_and_deletes(
    stack_env: dict[str, str], unique_name: str
) -> None:
    url = debezium.ensure_running()
    schema = unique_name
    dsn = stack_env["WALCAST_PG_DSN"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".acc (id int PRIMARY KEY, name text)')
        try:
            with debezium.connector(
                url, stack_env, unique_name, **{"schema.include.list": schema}
            ) as prefix:
                debezium.wait_for(
                    lambda: conn.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [prefix]
                    ).fetchone(),
                    "the connector's slot",
                )
                conn.execute(f"INSERT INTO \"{schema}\".acc VALUES (1, 'a')")
                conn.execute(f"UPDATE \"{schema}\".acc SET name = 'b' WHERE id = 1")
                conn.execute(f'DELETE FROM "{schema}".acc WHERE id = 1')
                records = debezium.read_topic(
                    stack_env,
                    f"{prefix}.{schema}.acc",
                    lambda r: len(r) >= 4,
                    "insert, update, delete and the delete's tombstone",
                )
        finally:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    assert [k["payload"] for k, _ in records] == [{"id": 1}] * 4
    values = [v["payload"] if v is not None else None for _, v in records]
    assert [v["op"] if v else None for v in values] == ["c", "u", "d", None]
    assert values[0]["after"] == {"id": 1, "name": "a"}
    assert values[1]["after"] == {"id": 1, "name": "b"}
    assert values[2]["before"] == {"id": 1, "name": None}  # replica identity: the key
    assert values[2]["after"] is None
    source = values[0]["source"]
    assert (source["connector"], source["schema"], source["table"]) == (
        "postgresql",
        schema,
        "acc",
    )
    assert source["lsn"] < values[1]["source"]["lsn"] < values[2]["source"]["lsn"]
