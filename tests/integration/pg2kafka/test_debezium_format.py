"""pg2kafka's ``debezium`` output format against the real Debezium PostgreSQL connector:
the same workload captured by both (the connector through the local stack's optional
Kafka Connect worker) gives records equal field by field, after normalising what
legitimately differs — the topic prefix in names, the producer's version, processing
times and ``source.sequence`` (docs/events.md)."""

from __future__ import annotations

import re
from typing import Any

from confluent_kafka.admin import AdminClient

from tests import debezium
from tests.integration.conftest import HarnessFactory

TABLES = {
    "acct": """(id bigint PRIMARY KEY, owner text NOT NULL, balance numeric(12,2),
        rate numeric, opened date, seen timestamptz, at timestamp, tags text[], scores int[],
        blob bytea, doc jsonb, flag boolean, ratio double precision)""",
    "pair": "(a int, b text, note varchar(20), PRIMARY KEY (a, b))",
}

WORKLOAD = [
    """INSERT INTO {s}.acct VALUES
        (1, 'ann', 10.50, 3.25, '2024-01-31', '2024-01-31 10:00:00.5+01', '2024-01-31 10:00',
         '{{a,"b c"}}', '{{1,NULL,3}}', '\\x00ff', '{{"k": [1, 2]}}', true, 0.1),
        (2, 'bob', -0.01, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, 'NaN')""",
    "UPDATE {s}.acct SET balance = balance + 1, seen = now() WHERE id = 1",
    "UPDATE {s}.acct SET id = 3 WHERE id = 2",  # a key change
    "DELETE FROM {s}.acct WHERE id = 1",
    "INSERT INTO {s}.pair VALUES (1, 'x', 'first'), (2, 'y', NULL)",
    "UPDATE {s}.pair SET note = 'second' WHERE a = 1",
    "DELETE FROM {s}.pair WHERE a = 2",
]
EXPECTED = {"acct": 8, "pair": 5}  # records per table, tombstones included


def normalise(record: tuple[Any, Any], prefix: str, read: bool = False) -> Any:
    """What legitimately differs between two producers of the same change; of a snapshot's
    rows (``read``) also what belongs to each producer's own snapshot: its slot's
    position (walcast: its restart position; Debezium: its consistent point), its reading
    transaction, its start, and which records Debezium marks first and last (walcast's
    parallel chunks mark none: docs/events.md)."""
    key, value = record
    text = re.sub(re.escape(prefix) + r"\.", "P.", repr((key, value)))
    key, value = eval(text)  # noqa: S307 - our own repr of JSON values
    if value is not None:
        value = debezium.without_walcast_fields(value)
        payload = value["payload"]
        for field in ("ts_ms", "ts_us", "ts_ns"):
            payload.pop(field)
        source = payload["source"]
        for field in ("version", "name", "sequence"):
            source.pop(field)
        if read:
            for field in ("lsn", "txId", "ts_ms", "ts_us", "ts_ns"):
                source.pop(field)
            if source["snapshot"] in ("first", "first_in_data_collection",
                                      "last_in_data_collection", "last"):  # fmt: skip
                source["snapshot"] = "true"
    return key, value


def compare(ours: list[Any], theirs: list[Any], prefixes: tuple[str, str], what: str,
            read: int = 0) -> None:  # fmt: skip
    """Records equal after normalising; the first ``read`` ones are a snapshot's."""
    assert len(theirs) == len(ours), (what, len(theirs), len(ours))
    for i, (t, o) in enumerate(zip(theirs, ours, strict=True)):
        o_n = normalise(o, prefixes[0], i < read)
        t_n = normalise(t, prefixes[1], i < read)
        if o_n != t_n:  # the payloads say what differs; the schemas follow
            o_p = o_n[1] and o_n[1]["payload"]
            t_p = t_n[1] and t_n[1]["payload"]
            assert (o_n[0], o_p) == (t_n[0], t_p), (what, i)
        assert o_n == t_n, (what, i)


def test_records_equal_the_real_connectors(
    make_harness: HarnessFactory, stack_env: dict[str, str], unique_name: str
) -> None:
    url = debezium.ensure_running()
    schema = unique_name
    ours_prefix = f"{unique_name}_w"
    h = make_harness(
        filters={"include": [f"{schema}.*"]},
        producer={"format": "debezium", "create_topic": True, "topic_partitions": 1},
        debezium={"topic_prefix": ours_prefix},
        snapshot={"mode": "never", "automatic": False},
    )
    for table, columns in TABLES.items():
        h.sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        h.sql(f'CREATE TABLE "{schema}".{table} {columns}')
    theirs_prefix = f"{unique_name}_d"
    try:
        with debezium.connector(
            url, stack_env, theirs_prefix, **{"schema.include.list": schema}
        ) as prefix:
            debezium.wait_for(
                lambda: h.sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [prefix]),
                "the connector's slot",
            )
            h.start()
            for statement in WORKLOAD:
                h.sql(statement.format(s=f'"{schema}"'))
            for table, count in EXPECTED.items():

                def enough(records: list[Any], count: int = count) -> bool:
                    return len(records) >= count

                theirs = debezium.read_topic(
                    stack_env, f"{prefix}.{schema}.{table}", enough, f"Debezium's {table}"
                )
                ours = debezium.read_topic(
                    stack_env, f"{ours_prefix}.{schema}.{table}", enough, f"pg2kafka's {table}"
                )
                assert len(ours) == count, (table, len(ours))
                compare(ours, theirs, (ours_prefix, prefix), table)
    finally:
        h.stop()
        h.sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin = AdminClient({"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]})
        topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(ours_prefix)]
        for fut in admin.delete_topics(topics).values() if topics else []:
            fut.result(60)


def test_snapshot_records_equal_the_real_connectors(
    make_harness: HarnessFactory, stack_env: dict[str, str], unique_name: str
) -> None:
    """Rows the tables held before either started: both snapshot them (``op r``) and then
    stream; the records compare equal as above, and walcast's snapshot records carry its
    slot's restart position, below every change streamed after them."""
    url = debezium.ensure_running()
    schema = unique_name
    ours_prefix = f"{unique_name}_w"
    h = make_harness(
        filters={"include": [f"{schema}.*"]},
        producer={"format": "debezium", "create_topic": True, "topic_partitions": 1},
        debezium={"topic_prefix": ours_prefix},
        snapshot={"mode": "initial", "automatic": False, "chunk_pages": 1},
    )
    h.sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    for table, columns in TABLES.items():
        h.sql(f'CREATE TABLE "{schema}".{table} {columns}')
    for statement in (WORKLOAD[0], WORKLOAD[4]):
        h.sql(statement.format(s=f'"{schema}"'))
    # Enough rows for several one-page chunks.
    h.sql(
        f'INSERT INTO "{schema}".pair SELECT g, repeat(md5(g::text), 3), NULL'
        " FROM generate_series(10, 400) g"
    )
    snapshot = {"acct": 2, "pair": 393}
    after = f"UPDATE \"{schema}\".pair SET note = 'after' WHERE a = 1"
    theirs_prefix = f"{unique_name}_d"
    try:
        with debezium.connector(
            url, stack_env, theirs_prefix,
            **{"schema.include.list": schema, "snapshot.mode": "initial"},
        ) as prefix:  # fmt: skip
            h.start()
            for table, rows in snapshot.items():

                def enough(records: list[Any], count: int = rows) -> bool:
                    return len(records) >= count

                theirs = debezium.read_topic(
                    stack_env, f"{prefix}.{schema}.{table}", enough, f"Debezium's {table}"
                )
                ours = debezium.read_topic(
                    stack_env, f"{ours_prefix}.{schema}.{table}", enough, f"pg2kafka's {table}"
                )
                assert len(ours) == rows, (table, len(ours))
                # Debezium reads in no particular order: compare by key.
                theirs.sort(key=lambda r: repr(r[0]))
                ours.sort(key=lambda r: repr(r[0]))
                compare(ours, theirs, (ours_prefix, prefix), table, read=rows)
                sources = {repr({k: r[1]["payload"]["source"][k] for k in ("lsn", "ts_ms")})
                           for r in ours}  # fmt: skip
                assert len(sources) == 1, sources  # one position, one start
                assert {r[1]["payload"]["source"]["snapshot"] for r in ours} == {"true"}
            # Streaming takes over after the snapshot, above its position.
            h.sql(after)

            def changed(records: list[Any]) -> bool:
                return any(r[1] and r[1]["payload"]["op"] == "u" for r in records)

            theirs = debezium.read_topic(
                stack_env, f"{prefix}.{schema}.pair", changed, "Debezium's update"
            )
            ours = debezium.read_topic(
                stack_env, f"{ours_prefix}.{schema}.pair", changed, "pg2kafka's update"
            )
            assert len(ours) == snapshot["pair"] + 1, len(ours)
            compare(ours[-1:], theirs[-1:], (ours_prefix, prefix), "update")
            read_lsn = ours[0][1]["payload"]["source"]["lsn"]
            assert ours[-1][1]["payload"]["source"]["lsn"] > read_lsn
    finally:
        h.stop()
        h.sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin = AdminClient({"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]})
        topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(ours_prefix)]
        for fut in admin.delete_topics(topics).values() if topics else []:
            fut.result(60)
