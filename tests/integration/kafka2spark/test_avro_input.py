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


def test_the_mirror_of_a_debezium_avro_topic_equals_the_table(
    make_harness: HarnessFactory, make_mirror: MirrorFactory, unique_name: str
) -> None:
    """Debezium's records in Avro (``format: debezium``, ``encoding: avro``), its initial
    snapshot included: keys and values decoded on the executors, then translated."""
    from services.pg2kafka import admin

    with running() as (url, _):
        h = make_harness(
            init=False,
            producer={"encoding": "avro", "format": "debezium", "create_topic": True,
                      "topic_partitions": 1},
            schema_registry={"url": url},
            snapshot={"mode": "initial", "automatic": False},
            filters={"include": [f"public.k2d_{unique_name[-8:]}"]},  # make_table's name
        )  # fmt: skip
        prefix = h.settings.debezium.topic_prefix
        table = make_table(h)
        h.sql(f"INSERT INTO {table} (id, name, price, ts) SELECT g, 'n' || g, g * 1.25,"
              " '2026-01-01 00:00:00+00' FROM generate_series(1, 50) g")  # fmt: skip
        admin.init(h.settings)
        h.start()
        h.sql(f"UPDATE {table} SET name = name || '!' WHERE id % 3 = 0")
        h.sql(f"DELETE FROM {table} WHERE id % 10 = 0")
        lsn = int(h.sql("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        slot = h.settings.replication.slot

        def streamed() -> bool:  # the slot appears with the snapshot
            rows = h.sql("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
                         " WHERE slot_name = %s", [slot])  # fmt: skip
            # (a slot just made has no confirmed position yet: NULL)
            return bool(rows) and rows[0][0] is not None and int(rows[0][0]) >= lsn

        wait_for(streamed, "the snapshot and the workload in Kafka", timeout=120)
        topic = f"{prefix}.public.{table}"
        made = make_mirror(topic)
        s = made.settings
        settings = s.model_copy(update={
            "schema_registry": SchemaRegistrySettings(url=url),
            "source": s.source.model_copy(update={"input_format": "debezium"}),
        })  # fmt: skip
        m = Mirror(made.spark, settings)
        m.run()
        columns = "id, name, price::text, active, doc::text, big, ts, op"
        assert delta_rows(m.path(table)) == pg_rows(h, table, columns)
        assert not (s.delta.root / "_quarantine").exists()
