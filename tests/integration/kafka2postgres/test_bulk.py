"""The bulk path (services/kafka2postgres/copying.py): batches of new rows COPYed into
the target, their versions recorded — and every case where it must give way to the
guarded statement: a key the target holds as a row, a key it holds only as a deleted
row's version, a value that needs converting (a date BC), a table with an array column.

Two kinds of source: pg2kafka (a snapshot and a bulk insert of every scalar type,
compared with plain SQL: each column's text output and ``to_jsonb``), and change events
written to a topic by hand, where a test needs a key's versions in an exact order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from services.pg2kafka import admin
from shared.kafka import ensure_topic
from tests.integration.conftest import HarnessFactory
from tests.integration.kafka2postgres.conftest import Replica, ReplicaFactory, table_schema
from tests.integration.kafka2postgres.test_types import EXTRA
from tests.integration.test_snapshot_sinks import ends
from tests.integration.test_type_walk import CASES, OTHERS

ROWS = 150
CONVERTED = {"x_date_bc", "x_date_far", "x_ts_bc", "x_tstz_bc", "x_date_inf"}
"""EXTRA's values the bulk path leaves to the guarded statement (expanded years)."""


def copies(r: Replica, outcome: str) -> float:
    assert r.service is not None
    value = r.service.registry.get_sample_value(
        "walcast_kafka2postgres_copy_batches_total", {"outcome": outcome}
    )
    return value or 0.0


def _scalar_table(h: Any, r: Replica, table: str, extra: dict[str, tuple[str, str]]) -> list[str]:
    for statement in (
        "DO $$ BEGIN CREATE TYPE walk_mood AS ENUM ('happy', 'sad');"
        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
        "DO $$ BEGIN CREATE DOMAIN walk_pos AS int4 CHECK (VALUE > 0);"
        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$",
    ):
        h.sql(statement)
        r.sql(statement)
    cols = [(f"c_{n}", t, v) for n, (t, v) in {**CASES, **OTHERS}.items()]
    cols += [(c, t, v) for c, (t, v) in extra.items() if not t.endswith("[]")]
    h.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, {', '.join(f'{c} {t}' for c, t, _ in cols)})")
    # every 7th row all NULL; the others every value (the key makes each row its own)
    values = ", ".join(f"CASE WHEN g % 7 = 0 THEN NULL ELSE ({v})::{t} END" for _, t, v in cols)
    names = ", ".join(c for c, _, _ in cols)
    h.sql(f"INSERT INTO {table} (id, {names}) SELECT g, {values} FROM generate_series(1, {ROWS}) g")
    return [c for c, _, _ in cols]


def _texts(run: Callable[..., Any], table: str, cols: list[str]) -> dict[int, tuple[Any, ...]]:
    exprs = ", ".join(f"{c}::text" for c in cols)
    return {
        r[0]: r[1:] for r in run(f"SELECT id, to_jsonb(t)::text, {exprs} FROM public.{table} t")
    }


@pytest.mark.parametrize("order", ["snapshotted", "inserted"])
def test_new_rows_of_every_scalar_type_are_copied_in_exactly(
    make_harness: HarnessFactory, make_replica: ReplicaFactory, order: str
) -> None:
    """``snapshotted``: read rows of an initial snapshot; ``inserted``: one INSERT of
    150 rows with pg2kafka running. A second table holds dates BC and past 9999: its
    batches go the guarded way (``converted``) and arrive just as exactly."""
    snapshot = order == "snapshotted"
    h = make_harness(init=not snapshot, snapshot={"mode": "initial" if snapshot else "never"})
    r = make_replica(h.settings.producer.topic)
    plain, odd = (f"{p}_{h.settings.replication.slot[-8:]}" for p in ("bulk", "bulkbc"))
    if not snapshot:
        h.start()
    plain_cols = _scalar_table(h, r, plain, {c: v for c, v in EXTRA.items() if c not in CONVERTED})
    odd_cols = _scalar_table(h, r, odd, {c: v for c, v in EXTRA.items() if c in CONVERTED})
    if snapshot:
        admin.init(h.settings)
        h.start()
        h.events(lambda seen: ends(seen, plain) == 1 and ends(seen, odd) == 1)
    r.start()
    for table, cols in ((plain, plain_cols), (odd, odd_cols)):
        r.wait_equal(h.dsn, f"public.{table}", "id")
        want, got = _texts(h.sql, table, cols), _texts(r.sql, table, cols)
        assert len(want) == ROWS
        names = ["to_jsonb", *cols]
        bad = {i: [(c, w, g) for c, w, g in zip(names, want[i], got[i], strict=True) if w != g]
               for i in want if want[i] != got.get(i)}  # fmt: skip
        assert bad == {}, f"{table}: {len(bad)} rows differ"
        if not snapshot:  # a snapshotted table is made from type names until its first DDL
            assert table_schema(r.dsn, f"public.{table}") == table_schema(h.dsn, f"public.{table}")
    assert copies(r, "copied") >= 1, "the plain table's rows went the bulk path"
    assert copies(r, "converted") >= 1, "the dates BC sent their batch the guarded way"
    # the versions were recorded: a second look at the rows (an update of each) applies
    h.sql(f"UPDATE {plain} SET c_text = 'after' WHERE id <= 10")
    r.wait(lambda: r.sql(f"SELECT count(*) FROM public.{plain} WHERE c_text = 'after'") == [(10,)],
           "the updates after the copy")  # fmt: skip
    held = r.sql("SELECT count(*) FROM _walcast_target.rows r JOIN _walcast_target.tables t"
                 " ON t.id = r.tbl WHERE t.target_table = %s AND NOT r.deleted",
                 [plain])  # fmt: skip
    assert held == [(ROWS,)]


class Topic:
    """Walcast change events of one table, written by hand to a one-partition topic."""

    def __init__(self, config: dict[str, Any], topic: str, table: str) -> None:
        self.types = {"id": "int4", "v": "text"}
        ensure_topic(config, topic, 1, 1)
        self.p = Producer(config)
        self.topic, self.table = topic, table

    def send(self, op: str, version: int, keys: range | list[int], value: str = "") -> None:
        for k in keys:
            ev: dict[str, Any] = {
                "v": 1, "op": op, "db": "hand", "schema": "public", "table": self.table,
                "lsn": version, "seq": k, "commit_lsn": version, "xid": 0 if op == "read" else 7,
                "commit_ts": "2026-11-28T00:00:00Z", "key": {"id": k}, "types": self.types,
            }  # fmt: skip
            if op != "delete":
                ev["new"] = {"id": k, "v": f"{value}{k}"}
            if op == "read":
                ev["snapshot"] = {"id": version, "chunk": 0}
            self.p.produce(self.topic, orjson.dumps(ev))
        assert self.p.flush(30) == 0


def test_keys_the_target_holds_send_the_batch_the_guarded_way(
    make_replica: ReplicaFactory, stack_env: dict[str, str], unique_name: str
) -> None:
    """A snapshot's read rows meeting rows the target holds at an older version (they
    win) and one deleted at a newer version (it stays deleted): the COPY fails on the held
    keys, the batch is applied the guarded way. A read row meeting only a deleted row's
    version — no row in the target, so the COPY itself succeeds — fails on that version,
    and the deleted row is not brought back."""
    config = {"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]}
    held = Topic(config, f"{unique_name}-held", "held")
    r = make_replica(held.topic).start()

    def count(table: str, where: str = "true") -> int:
        if r.sql("SELECT to_regclass(%s) IS NULL", [f"public.{table}"]) == [(True,)]:
            return -1
        return int(r.sql(f"SELECT count(*) FROM public.{table} WHERE {where}")[0][0])

    held.send("insert", 1000, range(1, 101), "ins")
    r.wait(lambda: count("held") == 100, "the inserts copied in")
    assert copies(r, "copied") == 1
    held.send("delete", 5000, [5])
    r.wait(lambda: count("held") == 99, "the delete")
    held.send("read", 3000, range(1, 101), "read")  # older than the delete, newer than the rest
    r.wait(lambda: count("held", "v LIKE 'read%'") == 99, "the read rows, the guarded way")
    assert count("held") == 99
    assert count("held", "id = 5") == 0
    assert copies(r, "held_key") == 1
    r.stop()

    gone = Topic(config, f"{unique_name}-gone", "gone")
    r = make_replica(gone.topic).start()
    gone.send("delete", 9000, [300])  # a row the target never had: only its version is held
    tombstones = ("SELECT count(*) FROM _walcast_target.rows r JOIN _walcast_target.tables t"
                  " ON t.id = r.tbl WHERE t.target_table = 'gone' AND r.deleted")  # fmt: skip
    r.wait(lambda: r.sql(tombstones) == [(1,)], "the deleted row's version")
    gone.send("read", 8000, range(300, 400), "read")
    r.wait(lambda: count("gone") == 99, "the read rows but the deleted one")
    assert count("gone", "id = 300") == 0
    assert copies(r, "held_key") == 1


def test_a_snapshots_start_marker_makes_the_table_with_the_sources_exact_types(
    make_replica: ReplicaFactory, stack_env: dict[str, str], unique_name: str
) -> None:
    """pg2kafka's initial snapshot start marker carries the table's schema (a DDL
    event's ``columns`` and ``primary_key``): a table it reaches first is made with the
    exact types; one whose rows made it first (types without length or precision) gets
    them when the marker comes; a marker after a later schema changes nothing."""
    config = {"bootstrap.servers": stack_env["WALCAST_KAFKA_BOOTSTRAP"]}
    columns = [
        {"name": "id", "type": "int4", "sql_type": "integer", "num": 1},
        {"name": "v", "type": "varchar", "sql_type": "character varying(12)", "num": 2},
    ]
    start = {"id": 500, "phase": "start", "columns": columns, "primary_key": ["id"]}
    first, late = Topic(config, f"{unique_name}-m", "first"), None
    r = make_replica(first.topic).start()

    def marker(topic: Topic, version: int) -> None:
        ev = {"v": 1, "op": "snapshot", "db": "hand", "schema": "public", "table": topic.table,
              "lsn": version, "seq": 0, "commit_lsn": version, "xid": 0,
              "commit_ts": "2026-11-28T00:00:00Z", "key": {}, "snapshot": start}  # fmt: skip
        topic.p.produce(topic.topic, orjson.dumps(ev))
        assert topic.p.flush(30) == 0

    def types(table: str) -> list[tuple[str, str]]:
        return [tuple(r) for r in r.sql(  # type: ignore[misc]
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid"
            " = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            [f"public.{table}"])]  # fmt: skip

    exact = [("id", "integer"), ("v", "character varying(12)")]
    first.types = {"id": "int4", "v": "varchar"}
    marker(first, 1000)
    first.send("read", 999, range(1, 4), "r")
    r.wait(lambda: r.sql("SELECT to_regclass('public.first') IS NOT NULL") == [(True,)]
           and len(r.sql("SELECT 1 FROM public.first")) == 3, "the snapshot's rows")  # fmt: skip
    assert types("first") == exact

    late = Topic(config, f"{unique_name}-l", "late")
    late.types = {"id": "int4", "v": "varchar"}
    r.stop()
    r2 = make_replica(late.topic, consumer={"group_id": f"{unique_name}-late"}).start()
    late.send("read", 999, range(1, 4), "r")  # the rows first: varchar without a length
    r2.wait(lambda: r2.sql("SELECT to_regclass('public.late') IS NOT NULL") == [(True,)]
            and len(r2.sql("SELECT 1 FROM public.late")) == 3, "the rows")  # fmt: skip
    assert types("late") == [("id", "integer"), ("v", "character varying")]
    marker(late, 1000)
    r2.wait(lambda: types("late") == exact, "the marker's exact types")
    assert sorted(r2.sql("SELECT id, v FROM public.late")) == [(1, "r1"), (2, "r2"), (3, "r3")]


ODD_TEXTS = ["", " ", "a b", 'q"', "back\\slash", "(x,y)", "tab\there", "new\nline", "NULL",
             "\\N", "()", ",", "end ", "x\x0by"]  # fmt: skip
"""Keys whose text (``ROW(k)::text``) the bulk path computes, quoting included."""
WIDE_TEXTS = ["é ü 字", "caf\u00e9", "\u00a0nbsp", "\u0085nel", "ascii"]
"""Keys with non-ASCII characters: their text is left to the server (its locale decides
whether such a character is a space that needs quotes)."""


def test_text_and_uuid_keys_recorded_by_the_bulk_path_are_found_by_later_changes(
    make_harness: HarnessFactory, make_replica: ReplicaFactory
) -> None:
    """The bulk path computes a text, uuid or integer key's text as the server prints
    ``ROW(k1, k2)::text`` (the versions' key); every later statement computes it on the
    server. Keys that need quoting (empty, blanks, quotes, backslashes, parentheses,
    commas, tabs, newlines) are copied in, then updated and some deleted: each key is held
    once, and every held version's key is one the server prints for a target row."""
    h = make_harness(init=True)
    r = make_replica(h.settings.producer.topic)
    h.start()
    r.start()
    suffix = h.settings.replication.slot[-8:]
    texts, uuids, pairs, wide = (f"{p}_{suffix}" for p in ("kt", "ku", "kp", "kw"))
    h.sql(f"CREATE TABLE {texts} (k text PRIMARY KEY, v int)")
    h.sql(f"CREATE TABLE {wide} (k text PRIMARY KEY, v int)")
    h.sql(f"CREATE TABLE {uuids} (k uuid PRIMARY KEY, v int)")
    h.sql(f"CREATE TABLE {pairs} (a bigint, b varchar(40), v int, PRIMARY KEY (a, b))")
    keys = [t + ("" if i == 0 else str(i)) for i in range(6) for t in ODD_TEXTS]  # 84 keys
    wide_keys = [t + ("" if i == 0 else str(i)) for i in range(14) for t in WIDE_TEXTS]
    h.sql(f"INSERT INTO {texts} SELECT k, 1 FROM unnest(%s::text[]) k", [keys])
    h.sql(f"INSERT INTO {wide} SELECT k, 1 FROM unnest(%s::text[]) k", [wide_keys])
    h.sql(f"INSERT INTO {uuids} SELECT gen_random_uuid(), 1 FROM generate_series(1, 100)")
    h.sql(f"INSERT INTO {pairs} SELECT g - 50, k, 1 FROM unnest(%s::text[]) WITH ORDINALITY"
          " AS u(k, g)", [keys])  # fmt: skip
    tables = ((texts, "k"), (uuids, "k"), (pairs, "a, b"), (wide, "k"))
    for table, key in tables:
        r.wait_equal(h.dsn, f"public.{table}", key)
    assert copies(r, "copied") >= 4, "each table's rows went the bulk path"
    # the tables it made keep room on each page for updated rows (target.fillfactor)
    assert r.sql("SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                 [f"public.{texts}"]) == [(["fillfactor=90"],)]  # fmt: skip
    for table, _ in tables:
        h.sql(f"UPDATE {table} SET v = 2")
        h.sql(f"DELETE FROM {table} WHERE v = 2 AND ctid IN (SELECT ctid FROM {table} LIMIT 5)")
    for table, key in tables:
        r.wait_equal(h.dsn, f"public.{table}", key)
        held = r.sql(
            "SELECT count(*), count(*) FILTER (WHERE r.deleted), count(*) FILTER (WHERE"
            f" NOT r.deleted AND NOT EXISTS (SELECT 1 FROM public.{table} t"
            f" WHERE ROW({', '.join('t.' + k.strip() for k in key.split(','))})::text = r.key))"
            " FROM _walcast_target.rows r JOIN _walcast_target.tables m ON m.id = r.tbl"
            " WHERE m.target_table = %s",
            [table],
        )
        source_rows = h.sql(f"SELECT count(*) FROM {table}")[0][0]
        assert held == [(source_rows + 5, 5, 0)], (
            f"{table}: (versions, deleted, versions of no target row) = {held[0]};"
            f" the source holds {source_rows} rows"
        )
