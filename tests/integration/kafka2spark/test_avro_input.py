"""kafka2spark reading walcast's events in Avro: pg2kafka (``producer.encoding: avro``)
writes a mixed workload with a DDL through the registry TEST DOUBLE
(tests/schema_registry.py; its HTTP server runs in this process, Spark's Python workers
reach it on 127.0.0.1), and the mirror — each record decoded on the executors through
the registry — equals the table, read back with ``deltalake``."""

from __future__ import annotations

from shared.settings import SchemaRegistrySettings
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2spark.conftest import Mirror, MirrorFactory, wait_for
from tests.integration.kafka2spark.test_mirror import delta_rows, make_table, pg_rows
from tests.schema_registry import running


def test_the_mirror_of_an_avro_topic_equals_the_table(
    make_harness: HarnessFactory, make_mirror: MirrorFactory
) -> None:
    with running() as (url, registry):
        h = make_harness(
            producer={"encoding": "avro"},
            schema_registry={"url": url, "subject_name_strategy": "topic_record"},
            snapshot={"mode": "never", "automatic": False},
        )
        table = make_table(h)
        h.start()
        h.sql(
            f"INSERT INTO {table} SELECT g, 'n' || g, g * 1.25, g % 2 = 0,"
            " jsonb_build_object('g', g), NULL,"
            " '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 minute'"
            " FROM generate_series(1, 100) g"
        )
        h.sql(f"UPDATE {table} SET name = name || '!' WHERE id % 3 = 0")
        h.sql(f"DELETE FROM {table} WHERE id % 10 = 0")
        h.sql(f"ALTER TABLE {table} ADD COLUMN qty int")
        h.sql(f"UPDATE {table} SET qty = id WHERE id < 20")
        lsn = int(h.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        wait_for(lambda: h.slot_confirmed() >= lsn, "the workload in Kafka")
        made = make_mirror(h.settings.producer.topic)
        s = made.settings
        m = Mirror(
            made.spark, s.model_copy(update={"schema_registry": SchemaRegistrySettings(url=url)})
        )
        m.run()
        columns = "id, name, price::text, active, doc::text, big, ts, op, qty"
        assert delta_rows(m.path(table)) == pg_rows(h, table, columns)
        assert not (s.delta.root / "_quarantine").exists()
        assert any(len(v) == 2 for v in registry.subjects.values())  # the DDL evolved it
        # The executors fetched the writer schemas (pg2kafka only registers them).
        assert any(m == "GET" and p.startswith("/schemas/ids/") for m, p in registry.requests)
