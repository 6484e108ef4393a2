"""kafka2postgres into a second PostgreSQL server (a cluster of its own beside the stack's,
tests/pgcluster.py): the source on the stack's server, streamed by pg2kafka through
Kafka on three partitions keyed by primary key, applied into a database on the other
server — inserts, updates, deletes, a truncate, schema changes — and then equal to the
source row by row, columns, types and key included, both read with plain SQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import HarnessFactory, difference
from tests.integration.kafka2postgres.conftest import ReplicaFactory, table_rows, table_schema
from tests.pgcluster import PgCluster


@pytest.fixture
def server() -> Iterator[PgCluster]:
    cluster = PgCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        cluster.remove()


def test_a_second_server_becomes_equal_to_the_source(
    make_harness: HarnessFactory, make_replica: ReplicaFactory, server: PgCluster
) -> None:
    h = make_harness(producer={"partition_key": "primary_key"})
    slot = h.settings.replication.slot
    t, other = f"ss_{slot[-8:]}", f"st_{slot[-8:]}"
    h.start()
    h.sql(f"CREATE TABLE {t} (id int PRIMARY KEY, price numeric(8,2), name varchar(10),"
          " at timestamptz, tags text[])")  # fmt: skip
    h.sql(f"CREATE TABLE {other} (id int PRIMARY KEY, v text)")
    h.sql(f"INSERT INTO {t} SELECT g, g * 1.25, 'n' || g, '2024-01-01'::timestamptz"
          " + g * interval '1 min', ARRAY['a', NULL] FROM generate_series(1, 500) g")  # fmt: skip
    h.sql(f"INSERT INTO {other} SELECT g, 'before' FROM generate_series(1, 40) g")
    r = make_replica(
        h.settings.producer.topic,
        target={"postgres": {"host": "127.0.0.1", "port": server.port, "user": "postgres",
                             "password": "", "database": "postgres"}},
    ).start()  # fmt: skip
    h.sql(f"UPDATE {t} SET price = price + 1 WHERE id % 3 = 0")
    h.sql(f"DELETE FROM {t} WHERE id % 11 = 0")
    h.sql(f"ALTER TABLE {t} ADD COLUMN note text")
    h.sql(f"UPDATE {t} SET note = 'n' || id WHERE id % 4 = 0")
    h.sql(f"ALTER TABLE {t} RENAME COLUMN name TO label")
    h.sql(f"TRUNCATE {other}")
    h.sql(f"INSERT INTO {other} SELECT g, 'after' FROM generate_series(30, 50) g")
    target = server.dsn

    for q in (f"public.{t}", f"public.{other}"):
        r.wait(lambda q=q: table_rows(target, q, "id") == table_rows(h.dsn, q, "id"),  # type: ignore[misc]
               f"{q} on the second server equal to the source", timeout=180)  # fmt: skip
        assert difference(table_rows(h.dsn, q, "id"), table_rows(target, q, "id")) == (
            [], [], [])  # fmt: skip
        assert table_schema(target, q) == table_schema(h.dsn, q)
    assert len(table_rows(target, f"public.{t}", "id")) == 500 - 45
