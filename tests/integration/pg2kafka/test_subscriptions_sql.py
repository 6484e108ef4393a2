"""The subscription model in SQL: generated triggers, set_subscriptions, partitions."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.sql
import pytest
from psycopg.types.json import Jsonb

from shared.migrations import migrate


class Db:
    def __init__(self, dsn: str, ns: str) -> None:
        self.dsn = dsn
        self.ns = ns  # unique per test: schema names, subscription keys, stream ids
        self.stream = random.randint(10**9, 2 * 10**9)

    def sql(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            cur = c.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def subscribe(self, key: str, **cols: Any) -> None:
        row = {"stream_id": self.stream, "operation": "INSERT", **cols, "key": f"{self.ns}:{key}"}
        names = ", ".join(row)
        marks = ", ".join(["%s"] * len(row))
        values = [
            Jsonb(v) if isinstance(v, (dict, list)) and k != "column_names" else v
            for k, v in row.items()
        ]
        self.sql(f"INSERT INTO _walcast.subscriptions ({names}) VALUES ({marks})", values)

    def events(self, stream: int | None = None) -> list[dict[str, Any]]:
        rows = self.sql(
            "SELECT payload, metadata FROM _walcast.events WHERE stream_id = %s ORDER BY id",
            [stream or self.stream],
        )
        return [{"payload": p, "metadata": m} for p, m in rows]

    def triggers(self, schema: str, table: str) -> list[tuple[str, int]]:
        return [
            (r[0], int(r[1]))
            for r in self.sql(
                "SELECT tgname, xmin::text::bigint FROM pg_trigger"
                " WHERE tgrelid = to_regclass(%s) ORDER BY tgname",
                [f"{schema}.{table}"],
            )
        ]


@pytest.fixture
def db(stack_env: dict[str, str], unique_name: str) -> Iterator[Db]:
    with psycopg.connect(stack_env["WALCAST_PG_DSN"], autocommit=True) as c:
        migrate(c)
    d = Db(stack_env["WALCAST_PG_DSN"], unique_name)
    d.sql("INSERT INTO _walcast.streams (id) VALUES (%s)", [d.stream])
    d.sql(f"CREATE SCHEMA {unique_name}")
    yield d
    d.sql("DELETE FROM _walcast.streams WHERE id = %s", [d.stream])  # cascades to subscriptions
    d.sql(f"DROP SCHEMA {unique_name} CASCADE")
    d.sql("DELETE FROM _walcast.events WHERE stream_id = %s", [d.stream])


def test_verified_user_signup_example(db: Db) -> None:
    s = db.ns
    db.sql(
        f"CREATE TABLE {s}.users (id int PRIMARY KEY, email text, email_verified boolean,"
        " created_at timestamptz)"
    )
    db.subscribe(
        "user-signup",
        schema_name=s,
        table_name="users",
        when_clause="new.email_verified = true",
        column_names=["id", "email", "created_at"],
    )
    before = int(time.time() * 1000)
    db.sql(
        f"INSERT INTO {s}.users VALUES (123, 'user@example.com', true,"
        " '2024-12-12T10:30:00Z'), (124, 'other@example.com', false, now())"
    )
    (ev,) = db.events()
    payload = ev["payload"]
    assert before - 1000 <= payload.pop("timestamp") <= int(time.time() * 1000) + 1000
    assert payload == {
        "tg_name": f"{s}:user-signup",
        "tg_op": "INSERT",
        "tg_table_name": "users",
        "tg_table_schema": s,
        "new": {"id": 123, "email": "user@example.com", "created_at": "2024-12-12T10:30:00+00:00"},
        "old": None,
    }


def test_order_notification_with_group_id_and_queue_name(db: Db) -> None:
    s = db.ns
    db.sql(
        f"CREATE TABLE {s}.orders (id int PRIMARY KEY, user_id int, total numeric(10,2),"
        " created_at timestamptz)"
    )
    db.subscribe(
        "order-notification",
        schema_name=s,
        table_name="orders",
        column_names=["id", "user_id", "total"],
        payload_extensions=[
            {"json_path": "group_id", "expression": "new.user_id::text"},
            {"json_path": "queue_name", "expression": "'order-notifications'"},
            {"json_path": "order.total_formatted", "expression": "'$' || new.total::text"},
        ],
        metadata={"topic": "orders"},
    )
    db.sql(f"INSERT INTO {s}.orders VALUES (456, 123, 99.99, '2024-12-12T10:30:00Z')")
    (ev,) = db.events()
    payload = ev["payload"]
    payload.pop("timestamp")
    assert payload == {
        "tg_name": f"{s}:order-notification",
        "tg_op": "INSERT",
        "tg_table_name": "orders",
        "tg_table_schema": s,
        "new": {"id": 456, "user_id": 123, "total": 99.99},
        "old": None,
        "group_id": "123",
        "queue_name": "order-notifications",
        "order": {"total_formatted": "$99.99"},
    }
    assert ev["metadata"] == {"topic": "orders"}


def test_several_subscriptions_on_one_table_and_operation(db: Db) -> None:
    s = db.ns
    db.sql(f"CREATE TABLE {s}.t (id int PRIMARY KEY, v int)")
    db.subscribe(
        "big", schema_name=s, table_name="t", operation="UPDATE", when_clause="new.v > 100"
    )
    db.subscribe(
        "changed",
        schema_name=s,
        table_name="t",
        operation="UPDATE",
        when_clause="old.v IS DISTINCT FROM new.v",
        column_names=["v"],
    )
    ((_, _),) = db.triggers(s, "t")
    trigger_def = db.sql(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass", [f"{s}.t"]
    )[0][0]
    # No subscription text in the trigger: a trigger WHEN runs as the application role and
    # outside the error isolation, so conditions are evaluated in the author's function.
    assert " WHEN " not in trigger_def
    assert "new.v" not in trigger_def
    db.sql(f"INSERT INTO {s}.t VALUES (1, 1)")
    db.sql(f"UPDATE {s}.t SET v = 1")  # matches neither
    db.sql(f"UPDATE {s}.t SET v = 500")  # matches both
    db.sql(f"UPDATE {s}.t SET v = 500")  # matches big only
    names = [e["payload"]["tg_name"].split(":")[1] for e in db.events()]
    assert names == ["big", "changed", "big"]
    changed = db.events()[1]["payload"]
    assert changed["new"] == {"v": 500}
    assert changed["old"] == {"v": 1}
    # one subscription without a condition: the trigger fires on every update
    db.subscribe("all", schema_name=s, table_name="t", operation="UPDATE")
    trigger_def = db.sql(
        "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = %s::regclass", [f"{s}.t"]
    )[0][0]
    assert " WHEN " not in trigger_def


def test_same_table_name_in_two_schemas_and_two_streams(db: Db) -> None:
    a, b = f"{db.ns}_a", f"{db.ns}_b"
    other_stream = db.stream + 1
    db.sql("INSERT INTO _walcast.streams (id) VALUES (%s)", [other_stream])
    try:
        for schema in (a, b):
            db.sql(f"CREATE SCHEMA {schema}")
            db.sql(f"CREATE TABLE {schema}.users (id int PRIMARY KEY)")
        db.subscribe("a-users", schema_name=a, table_name="users")
        db.subscribe("b-users", schema_name=b, table_name="users", stream_id=other_stream)
        db.sql(f"INSERT INTO {a}.users VALUES (1)")
        db.sql(f"INSERT INTO {b}.users VALUES (2)")
        mine = db.events()
        theirs = db.events(other_stream)
        assert [(e["payload"]["tg_table_schema"], e["payload"]["new"]["id"]) for e in mine] == [
            (a, 1)
        ]
        assert [(e["payload"]["tg_table_schema"], e["payload"]["new"]["id"]) for e in theirs] == [
            (b, 2)
        ]
        fns = db.sql(
            "SELECT function_name FROM _walcast.generated_triggers WHERE schema_name IN (%s, %s)",
            [a, b],
        )
        assert len({f[0] for f in fns}) == 2  # one function per (schema, table, operation)
    finally:
        db.sql("DELETE FROM _walcast.streams WHERE id = %s", [other_stream])
        db.sql("DELETE FROM _walcast.events WHERE stream_id = %s", [other_stream])
        db.sql(f"DROP SCHEMA {a} CASCADE")
        db.sql(f"DROP SCHEMA {b} CASCADE")


def test_moving_a_subscription_and_deleting_its_stream_remove_triggers(db: Db) -> None:
    s = db.ns
    db.sql(f"CREATE TABLE {s}.one (id int PRIMARY KEY)")
    db.sql(f"CREATE TABLE {s}.two (id int PRIMARY KEY)")
    db.subscribe("mover", schema_name=s, table_name="one")
    assert [t for t, _ in db.triggers(s, "one")] == ["_walcast_insert"]
    db.sql("UPDATE _walcast.subscriptions SET table_name = 'two' WHERE key = %s", [f"{s}:mover"])
    assert db.triggers(s, "one") == []
    assert [t for t, _ in db.triggers(s, "two")] == ["_walcast_insert"]
    db.sql("DELETE FROM _walcast.streams WHERE id = %s", [db.stream])
    assert db.triggers(s, "two") == []
    assert db.sql("SELECT count(*) FROM _walcast.subscriptions WHERE key = %s", [f"{s}:mover"]) == [
        (0,)
    ]
    db.sql(f"INSERT INTO {s}.two VALUES (1)")
    assert db.events() == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"when_clause": "new.nope = 1"}, "invalid when_clause"),
        ({"when_clause": "old.id = 1"}, "OLD"),  # an INSERT trigger has no old row
        ({"column_names": ["id", "nope"]}, "unknown column(s) {nope}"),
        (
            {"payload_extensions": [{"json_path": "x", "expression": "new.nope"}]},
            "invalid payload extension x",
        ),
        ({"payload_extensions": [{"json_path": "x"}]}, "needs json_path and expression"),
        ({"table_name": "missing"}, "does not exist"),
    ],
)
def test_invalid_subscription_is_rejected_and_existing_triggers_stay(
    db: Db, bad: dict[str, Any], message: str
) -> None:
    s = db.ns
    db.sql(f"CREATE TABLE {s}.t (id int PRIMARY KEY)")
    db.subscribe("good", schema_name=s, table_name="t")
    before = db.triggers(s, "t")
    with pytest.raises(psycopg.Error, match=message.replace("(", r"\(").replace(")", r"\)")):
        db.subscribe("bad", **{"schema_name": s, "table_name": "t", **bad})
    assert db.triggers(s, "t") == before
    db.sql(f"INSERT INTO {s}.t VALUES (1)")
    assert [e["payload"]["tg_name"] for e in db.events()] == [f"{s}:good"]


def _set(db: Db, subs: list[dict[str, Any]]) -> None:
    rows = []
    for sub in subs:
        rows.append(
            db.sql(
                # the last field, author, is set from current_user whatever is passed
                "SELECT ROW(%s, %s, %s, %s, %s, %s, %s, %s, %s, now(), now(), NULL)"
                "::_walcast.subscriptions::text",
                [
                    f"{db.ns}:{sub['key']}",
                    db.stream,
                    sub.get("operation", "INSERT"),
                    sub["schema_name"],
                    sub["table_name"],
                    sub.get("when_clause"),
                    sub.get("column_names"),
                    None,
                    Jsonb(sub.get("payload_extensions", [])),
                ],
            )[0][0]
        )
    db.sql("SELECT _walcast.set_subscriptions(%s, %s::_walcast.subscriptions[])", [db.stream, rows])


def test_set_subscriptions_merges_and_a_repeat_issues_no_ddl(db: Db) -> None:
    s = db.ns
    db.sql(f"CREATE TABLE {s}.t (id int PRIMARY KEY, v int)")
    wanted = [
        {"key": "ins", "schema_name": s, "table_name": "t"},
        {
            "key": "upd",
            "schema_name": s,
            "table_name": "t",
            "operation": "UPDATE",
            "when_clause": "new.v > 1",
        },
    ]
    _set(db, wanted)
    triggers = db.triggers(s, "t")
    assert [t for t, _ in triggers] == ["_walcast_insert", "_walcast_update"]
    procs = db.sql(
        "SELECT proname, xmin::text FROM pg_proc WHERE proname IN"
        " (SELECT function_name FROM _walcast.generated_triggers WHERE schema_name = %s)"
        " ORDER BY 1",
        [s],
    )
    subs = db.sql(
        "SELECT key, xmin::text FROM _walcast.subscriptions WHERE stream_id = %s ORDER BY 1",
        [db.stream],
    )
    _set(db, wanted)  # identical: nothing may change
    assert db.triggers(s, "t") == triggers
    assert (
        db.sql(
            "SELECT proname, xmin::text FROM pg_proc WHERE proname IN"
            " (SELECT function_name FROM _walcast.generated_triggers"
            " WHERE schema_name = %s) ORDER BY 1",
            [s],
        )
        == procs
    )
    assert (
        db.sql(
            "SELECT key, xmin::text FROM _walcast.subscriptions WHERE stream_id = %s ORDER BY 1",
            [db.stream],
        )
        == subs
    )
    # merge: drop "upd", change nothing else
    _set(db, wanted[:1])
    assert [t for t, _ in db.triggers(s, "t")] == ["_walcast_insert"]
    assert db.triggers(s, "t")[0] == triggers[0]  # the untouched trigger was not recreated


def test_events_are_written_at_commit_and_manual_events_are_allowed(db: Db) -> None:
    s = db.ns
    db.sql(f"CREATE TABLE {s}.t (id int PRIMARY KEY)")
    db.subscribe("t", schema_name=s, table_name="t")
    with psycopg.connect(db.dsn) as c:
        c.execute(f"INSERT INTO {s}.t VALUES (1)")
        c.rollback()
    assert db.events() == []
    db.sql(
        "INSERT INTO _walcast.events (payload, metadata, stream_id) VALUES (%s, %s, %s)",
        [Jsonb({"type": "job-completed", "job_id": 7}), Jsonb({"topic": "jobs"}), db.stream],
    )
    assert db.events() == [
        {"payload": {"type": "job-completed", "job_id": 7}, "metadata": {"topic": "jobs"}}
    ]


def test_partition_maintenance_across_days_including_late_runs(db: Db) -> None:
    # A past calendar nobody else uses, so the test owns these partitions (maintenance
    # refuses a clock in the future: that is the direction that drops more).
    day0 = datetime(1900 + random.randint(0, 90), 1, 1, tzinfo=UTC)

    def names() -> set[str]:
        return {
            r[0]
            for r in db.sql(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = '_walcast.events'::regclass"
            )
        }

    def part(day: datetime) -> str:
        return "events_" + day.strftime("%Y%m%d")

    try:
        # Maintenance is late: an application writes on day0 anyway -> DEFAULT partition.
        db.sql(
            "INSERT INTO _walcast.events (payload, stream_id, created_at) VALUES (%s, %s, %s)",
            [Jsonb({"n": 1}), db.stream, day0 + timedelta(hours=5)],
        )
        assert db.sql(
            "SELECT count(*) FROM _walcast.events_default WHERE stream_id = %s", [db.stream]
        ) == [(1,)]
        done = db.sql("SELECT _walcast.maintain_partitions(7, 7, %s)", [day0])[0][0]
        assert done["moved_from_default"] == 1
        assert {part(day0 + timedelta(days=d)) for d in range(8)} <= names()
        assert db.sql(
            "SELECT tableoid::regclass::text FROM _walcast.events WHERE stream_id = %s", [db.stream]
        ) == [(f"_walcast.{part(day0)}",)]
        # Ten days later the partition is past retention, but the stream has not delivered
        # its event yet: it is kept.
        later = day0 + timedelta(days=10)
        done = db.sql("SELECT _walcast.maintain_partitions(7, 7, %s)", [later])[0][0]
        assert part(day0) in done["kept"]
        assert part(day0) in names()
        # Once delivered (the stream's delivered snapshot sees the writing transaction),
        # maintenance drops what fell out of the 7-day retention.
        db.sql(
            "UPDATE _walcast.streams SET delivered_snapshot = pg_current_snapshot() WHERE id = %s",
            [db.stream],
        )
        done = db.sql("SELECT _walcast.maintain_partitions(7, 7, %s)", [later])[0][0]
        assert part(day0) in done["dropped"]
        assert part(day0) not in names()
        assert part(later + timedelta(days=7)) in names()
        assert db.sql("SELECT count(*) FROM _walcast.events WHERE stream_id = %s", [db.stream]) == [
            (0,)
        ]
        # Running it again the same day changes nothing.
        again = db.sql("SELECT _walcast.maintain_partitions(7, 7, %s)", [later])[0][0]
        assert again == {"created": [], "dropped": [], "kept": [], "moved_from_default": 0}
    finally:
        for name in names():
            if name.startswith(f"events_{day0.year}") or name.startswith(f"events_{day0.year + 1}"):
                db.sql(f"DROP TABLE _walcast.{name}")


def test_an_upgrade_to_v012_recompiles_expressions_and_triggers(
    stack_env: dict[str, str], unique_name: str
) -> None:
    """A database whose subscriptions were written under V011 (SQL expression functions,
    one exception block and one INSERT per subscription) gets PL/pgSQL functions and the
    one-block trigger from the migration alone, and its events stay the same."""
    admin = stack_env["WALCAST_PG_DSN"]
    database = f"walcast_{unique_name}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(database)))
    dsn = psycopg.conninfo.make_conninfo(admin, dbname=database)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            migrate(c, up_to=11)
        d = Db(dsn, unique_name)
        d.sql("INSERT INTO _walcast.streams (id) VALUES (%s)", [d.stream])
        d.sql("CREATE TABLE public.orders (id int PRIMARY KEY, total int, status text)")
        for i in range(3):
            d.subscribe(
                f"s{i}",
                schema_name="public",
                table_name="orders",
                when_clause=f"new.total > {i}",
                column_names=["id"],
                payload_extensions=[{"json_path": "s", "expression": "upper(new.status)"}],
            )

        def languages() -> list[str]:
            return [
                r[0]
                for r in d.sql(
                    "SELECT DISTINCT l.lanname FROM pg_proc p JOIN pg_language l"
                    " ON l.oid = p.prolang WHERE p.pronamespace = '_walcast_sub'::regnamespace"
                )
            ]

        def trigger_source() -> str:
            return str(
                d.sql(
                    "SELECT p.prosrc FROM _walcast.generated_triggers g JOIN pg_proc p"
                    " ON p.proname = g.function_name"
                    " AND p.pronamespace = '_walcast'::regnamespace"
                    " WHERE g.operation = 'INSERT'"
                )[0][0]
            )

        # A subscription whose when_clause calls a function that leaves a trace when run:
        # the upgrade recompiles it without running anything of the author's (planning
        # it would: the planner folds an immutable call on constants).
        d.sql(
            "CREATE FUNCTION public.trace(n int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS"
            " $$ BEGIN PERFORM set_config('walcast.trace', 'ran', false); RETURN n; END $$"
        )
        d.subscribe(
            "traced",
            operation="UPDATE",
            schema_name="public",
            table_name="orders",
            when_clause="public.trace(1) > 0",
            column_names=["id"],
        )
        # A subscription whose author has since been dropped (it owned nothing: no
        # expressions) must not stop the upgrade.
        gone = f"{unique_name}_gone"[:60]
        d.sql(f'CREATE ROLE "{gone}"')
        d.sql(f'GRANT walcast_admin TO "{gone}"')
        d.sql(f'GRANT SELECT ON public.orders TO "{gone}"')
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'SET ROLE "{gone}"')
            c.execute(
                "INSERT INTO _walcast.subscriptions (key, stream_id, operation, schema_name,"
                " table_name) VALUES (%s, %s, 'DELETE', 'public', 'orders')",
                [f"{unique_name}:gone", d.stream],
            )
        d.sql(f'DROP OWNED BY "{gone}"')
        d.sql(f'DROP ROLE "{gone}"')
        assert languages() == ["sql"]
        assert trigger_source().count("EXCEPTION WHEN") == 3
        d.sql("INSERT INTO public.orders VALUES (1, 2, 'new')")  # s0, s1 match
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT set_config('walcast.trace', 'not run', false)")
            assert "V012__cheaper_subscription_triggers" in migrate(c)
            assert c.execute("SELECT current_setting('walcast.trace')").fetchone() == ("not run",)
        assert languages() == ["plpgsql"]
        assert trigger_source().count("EXCEPTION WHEN") == 4  # one for all, one each
        d.sql("INSERT INTO public.orders VALUES (2, 2, 'new')")
        events = [e["payload"] for e in d.events()]
        assert [(e["new"]["id"], e["tg_name"], e["s"]) for e in events] == [
            (1, f"{unique_name}:s0", "NEW"),
            (1, f"{unique_name}:s1", "NEW"),
            (2, f"{unique_name}:s0", "NEW"),
            (2, f"{unique_name}:s1", "NEW"),
        ]
        assert d.sql("SELECT count(*) FROM _walcast.subscription_errors") == [(0,)]
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(database)
                )
            )
