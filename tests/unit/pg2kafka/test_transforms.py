"""Column transformers (services/pg2kafka/transforms.py): the actions, the rules' order
and wildcards, and every place a value leaves by — rows, old images, keys, snapshot rows,
DDL column lists, the Debezium format and subscription payloads. Against Postgres and
Kafka: tests/integration/pg2kafka/test_transforms.py."""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder, Transaction
from services.pg2kafka.debezium_format import DebeziumRecords
from services.pg2kafka.event_records import event_message
from services.pg2kafka.filters import TableFilter
from services.pg2kafka.settings import DebeziumSettings, TransformSettings
from services.pg2kafka.transforms import (
    CatalogColumn,
    Transforms,
    check_catalog,
    fake_email,
    fake_phone,
    mask,
)
from services.pg2kafka.types import TypeRegistry
from shared.contract.event import SnapshotInfo
from shared.contract.rowhash import row_hash
from shared.errors import ConfigError, PermanentError

KEY = "0123456789abcdef-key"
USERS = pg.Relation(
    16384, "app", "users", "d",
    (pg.Column("id", 23, -1, True), pg.Column("email", 1043, 120, False),
     pg.Column("phone", 25, -1, False), pg.Column("ssn", 25, -1, False),
     pg.Column("age", 23, -1, False), pg.Column("bio", 25, -1, False)),
)  # fmt: skip


def transforms(*rules: dict[str, Any], key: str | None = KEY) -> Transforms:
    return Transforms(TransformSettings(rules=list(rules), hash_key=key))  # type: ignore[arg-type]


def hexmac(value: str) -> str:
    return hmac.new(KEY.encode(), value.encode(), hashlib.sha256).hexdigest()


def builder(t: Transforms, rel: pg.Relation = USERS) -> EventBuilder:
    b = EventBuilder("db", TypeRegistry(), transforms=t)
    b.relation(rel)
    b.begin(pg.Begin(500, 1_700_000_000_000_000, 7))
    return b


def events(b: EventBuilder, msg: pg.Insert | pg.Update | pg.Delete) -> list[Any]:
    return [orjson.loads(orjson.dumps(ev)) for ev in b.change(msg, 400)]


ROW = ("1", "ann@acme.example.com", "+44 20 7946-0958", "123-45-6789", "42", "long bio text")


def test_each_action_on_a_change_event() -> None:
    t = transforms(
        {"column": "app.users.email", "action": "fake", "kind": "email"},
        {"column": "app.users.phone", "action": "mask", "keep": 4},
        {"column": "app.users.ssn", "action": "hash"},
        {"column": "app.users.age", "action": "null"},
        {"column": "app.users.bio", "action": "truncate", "length": 4},
    )
    (ev,) = events(builder(t), pg.Insert(USERS.oid, ROW))
    new = ev["new"]
    assert new["id"] == 1
    assert re.fullmatch(r"[a-z0-9]{3}@[a-z]{4}\.[a-z]{7}\.com", new["email"]), new["email"]
    assert new["phone"] == "*" * 12 + "0958"
    assert new["ssn"] == hexmac("123-45-6789")
    assert new["age"] is None
    assert new["bio"] == "long"
    # Rewritten columns are text now; a NULLed one keeps its type.
    assert ev["types"] == {"id": "int4", "email": "text", "phone": "text", "ssn": "text",
                           "age": "int4", "bio": "text"}  # fmt: skip


def test_drop_and_redact_and_the_first_matching_rule_wins() -> None:
    t = transforms(
        {"column": "app.users.ssn", "action": "redact", "value": "<hidden>"},
        {"column": "*.*.s*", "action": "drop"},  # ssn: the earlier rule wins
        {"column": "app.*.bio", "action": "drop"},
    )
    (ev,) = events(builder(t), pg.Insert(USERS.oid, ROW))
    assert ev["new"]["ssn"] == "<hidden>"
    assert "bio" not in ev["new"]
    assert "bio" not in ev["types"]
    assert set(ev["new"]) == {"id", "email", "phone", "ssn", "age"}


def test_old_images_keys_and_key_changes_are_transformed() -> None:
    t = transforms({"column": "app.users.id", "action": "hash"},
                   {"column": "app.users.email", "action": "drop"})  # fmt: skip
    b = builder(t)
    old = ("1", "a@b.c", None, None, None, None)
    moved = events(b, pg.Update(USERS.oid, ("2", *ROW[1:]), "K", old))
    assert [e["op"] for e in moved] == ["delete", "insert"]
    assert moved[0]["key"] == {"id": hexmac("1")}
    assert moved[1]["key"] == {"id": hexmac("2")}
    full = pg.Update(USERS.oid, ROW, "O", ("1", "old@x.org", "p", "s", "1", "b"))
    (upd,) = events(b, full)
    assert upd["old"]["id"] == hexmac("1")
    assert "email" not in upd["old"]
    (gone,) = events(b, pg.Delete(USERS.oid, "O", ROW))
    assert gone["old"] == {"id": hexmac("1"), "phone": ROW[2], "ssn": ROW[3], "age": 42,
                           "bio": ROW[5]}  # fmt: skip


def test_null_and_unchanged_toast_pass_through() -> None:
    t = transforms({"column": "app.users.*", "action": "redact"},
                   {"column": "app.users.id", "action": "hash"})  # fmt: skip
    with pytest.raises(PermanentError, match=r"app\.users\.id"):
        # The wildcard rule comes first and matches the key column.
        events(builder(t), pg.Insert(USERS.oid, ROW))
    t = transforms({"column": "app.users.id", "action": "hash"},
                   {"column": "app.users.*", "action": "redact"})  # fmt: skip
    values = ("1", None, pg.UNCHANGED_TOAST, "x", "1", None)
    (ev,) = events(builder(t), pg.Update(USERS.oid, values, None, None))
    assert ev["new"]["email"] is None
    assert "phone" not in ev["new"]
    assert ev["unchanged_toast"] == ["phone"]
    assert ev["new"]["ssn"] == "REDACTED"


@pytest.mark.parametrize("action", ["mask", "redact", "truncate", "null", "drop", "fake"])
def test_a_rule_that_would_break_a_keys_uniqueness_is_refused(action: str) -> None:
    extra: dict[str, dict[str, Any]] = {"truncate": {"length": 2}, "fake": {"kind": "phone"}}
    params = extra.get(action, {})
    t = transforms({"column": "*.users.id", "action": action, **params})
    with pytest.raises(PermanentError, match=r"app\.users\.id.*only hash") as err:
        events(builder(t), pg.Insert(USERS.oid, ROW))
    assert "narrow the rule" in str(err.value)


def test_full_identity_without_a_primary_key_is_no_unique_key() -> None:
    rel = pg.Relation(9, "app", "log", "f",
                      (pg.Column("line", 25, -1, True), pg.Column("at", 25, -1, True)))  # fmt: skip
    t = transforms({"column": "app.log.line", "action": "mask"})
    (ev,) = events(builder(t, rel), pg.Insert(9, ("secret", "x")))
    assert ev["new"]["line"] == "******"


def test_snapshot_rows_are_transformed() -> None:
    t = transforms({"column": "app.users.ssn", "action": "hash"})
    b = builder(t)
    info: SnapshotInfo = {"id": "s", "table_rows": 1}  # type: ignore[typeddict-item]
    ev = orjson.loads(orjson.dumps(b.read(USERS, ROW, 10, 0, "2024-01-01T00:00:00Z", info)))
    assert ev["new"]["ssn"] == hexmac("123-45-6789")
    assert ev["types"]["ssn"] == "text"


def test_ddl_column_lists_follow_the_rules(caplog: pytest.LogCaptureFixture) -> None:
    t = transforms({"column": "app.users.email", "action": "mask"},
                   {"column": "app.users.bio", "action": "drop"},
                   {"column": "app.users.age", "action": "null"},
                   {"column": "app.users.gone", "action": "drop"})  # fmt: skip
    cols = [{"name": n, "type": ty, "sql_type": ty, "nullable": False, "num": i}
            for i, (n, ty) in enumerate([("id", "int4"), ("email", "varchar"), ("bio", "text"),
                                         ("age", "int4")], 1)]  # fmt: skip
    payload = {"tag": "ALTER TABLE", "statement": "ALTER TABLE ...",
               "tables": [{"schema": "app", "table": "users", "columns": cols,
                           "primary_key": ["id"]}]}  # fmt: skip
    b = builder(t)
    (ev,) = b.ddl(pg.Message(True, 1, "walcast.ddl", orjson.dumps(payload)), 1)
    out = ev["ddl"]["columns"]
    assert [c["name"] for c in out] == ["id", "email", "age"]
    assert out[1]["type"] == out[1]["sql_type"] == "text"
    assert out[2]["nullable"] is True
    assert out[2]["type"] == "int4"
    assert "app.users.gone" in caplog.text  # a rule naming a column the table lost


def test_a_key_is_judged_by_the_identity_the_events_carry() -> None:
    full = pg.Relation(9, "app", "t", "f",
                       (pg.Column("a", 25, -1, True), pg.Column("b", 25, -1, True)))  # fmt: skip
    t = transforms({"column": "app.t.a", "action": "mask"})
    # FULL identity whose primary key is every column: a unique key, refused.
    b = EventBuilder("db", TypeRegistry(), primary_key=lambda _oid: ["a", "b"], transforms=t)
    b.relation(full)
    b.begin(pg.Begin(1, 0, 1))
    with pytest.raises(PermanentError, match=r"app\.t\.a, a key column"):
        b.change(pg.Insert(9, ("x", "y")), 1)
    # Without a primary key the whole row is the key, not unique anyway: allowed.
    b = EventBuilder("db", TypeRegistry(), primary_key=lambda _oid: [], transforms=t)
    b.relation(full)
    b.begin(pg.Begin(1, 0, 1))
    (ev,) = b.change(pg.Insert(9, ("xy", "y")), 1)
    assert orjson.loads(orjson.dumps(ev))["new"]["a"] == "**"


def test_the_debezium_format_is_transformed_with_matching_schemas() -> None:
    t = transforms({"column": "app.users.age", "action": "hash"},
                   {"column": "app.users.email", "action": "null"},
                   {"column": "app.users.bio", "action": "drop"})  # fmt: skip
    r = DebeziumRecords(DebeziumSettings(), "db", TypeRegistry(),
                        lambda _oid: {"id", "email"}, lambda _oid: ["id"],
                        transforms=t)  # fmt: skip
    txn = Transaction(xid=7, commit_lsn=100, commit_ts="", seq=1, commit_us=1)
    (rec,) = r.change(USERS, pg.Insert(USERS.oid, ROW), txn, 90)
    value = orjson.loads(rec.value or b"")
    after = value["payload"]["after"]
    assert after["age"] == hexmac("42")
    assert after["email"] is None
    assert "bio" not in after
    fields = {f["field"]: f for f in value["schema"]["fields"][1]["fields"]}
    assert fields["age"]["type"] == "string"
    assert fields["email"]["optional"] is True  # NOT NULL, but the rule writes NULL
    assert "bio" not in fields
    # verify compares the source's rows: the hash is of the values before the rules
    names = [c.name for c in USERS.columns]
    assert value["payload"]["source"]["walcast_hash"] == row_hash(zip(names, ROW, strict=True))


def test_subscription_payloads_new_and_old_are_transformed() -> None:
    t = transforms({"column": "app.users.email", "action": "hash"},
                   {"column": "app.users.age", "action": "drop"})  # fmt: skip
    doc = {"tg_name": "s", "tg_table_schema": "app", "tg_table_name": "users",
           "new": {"id": 1, "email": "a@b.c", "age": 3}, "old": {"id": 1, "email": None},
           "group_id": "a@b.c"}  # fmt: skip
    row = {"id": 5, "stream_id": 1, "created_at": "t", "payload": orjson.dumps(doc).decode()}
    out = event_message("topic", row, "new.email", 11, t)
    assert out is not None
    assert out.value is not None
    sent = orjson.loads(out.value)
    assert sent["new"] == {"id": 1, "email": hexmac("a@b.c")}
    assert sent["old"] == {"id": 1, "email": None}
    assert sent["group_id"] == "a@b.c"  # an extension is its author's: rules do not see it
    assert out.key == hexmac("a@b.c").encode()  # the key comes from the rewritten payload
    orders = orjson.dumps({**doc, "tg_table_name": "orders"}).decode()
    untouched = event_message("topic", {**row, "payload": orders}, None, 11, t)
    assert untouched is not None
    assert untouched.value == orders.encode()


def test_masking_never_reveals_a_short_value_whole() -> None:
    assert mask("4111111111111111", 4, "end", "*") == "*" * 12 + "1111"
    assert mask("abc", 4, "end", "#") == "##c"
    assert mask("abcdef", 2, "start", "x") == "abxxxx"
    assert mask("", 3, "end", "*") == ""


def test_fakes_are_deterministic_keyed_and_keep_their_format() -> None:
    k = KEY.encode()
    assert fake_email(k, "Jane.Doe@corp.co.uk") == fake_email(k, "Jane.Doe@corp.co.uk")
    assert fake_email(k, "Jane.Doe@corp.co.uk") != fake_email(k, "jane.doe@corp.co.uk")
    assert fake_email(k, "a@b.c") != fake_email(b"another-key-of-16+", "a@b.c")
    assert re.fullmatch(r"[a-z0-9]{8}@[a-z]{4}\.[a-z]{2}\.uk", fake_email(k, "Jane.Doe@corp.co.uk"))
    assert fake_email(k, "no-at-sign").endswith("@example.invalid")
    phone = fake_phone(k, "+1 (555) 010-9999")
    assert re.fullmatch(r"\+[1-9] \(\d{3}\) \d{3}-\d{4}", phone)
    assert phone != "+1 (555) 010-9999"
    assert fake_phone(k, "+1 (555) 010-9999") == phone
    fakes = {fake_phone(k, f"+44 7700 900{i:03d}") for i in range(200)}
    assert len(fakes) > 190  # deterministic, not constant


def test_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ValidationError, match="hash_key"):
        TransformSettings(rules=[{"column": "a.b.c", "action": "hash"}])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="16 characters"):
        TransformSettings(hash_key="short")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"schema\.table\.column"):
        TransformSettings(rules=[{"column": "users.email", "action": "drop"}])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match="length"):
        TransformSettings(rules=[{"column": "a.b.c", "action": "truncate"}])  # type: ignore[list-item]
    with pytest.raises(ValidationError, match=r"\['keep'\] do\(es\) not apply to action 'hash'"):
        TransformSettings(rules=[{"column": "a.b.c", "action": "hash", "keep": 2}],  # type: ignore[list-item]
                          hash_key=KEY)  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(ValidationError, match="kind"):
        TransformSettings(rules=[{"column": "a.b.c", "action": "fake"}], hash_key=KEY)  # type: ignore[list-item,arg-type]


def test_hash_key_is_a_secret() -> None:
    s = TransformSettings(hash_key=KEY)  # type: ignore[arg-type]
    assert KEY not in repr(s)
    assert KEY not in str(s.model_dump())


CATALOG = [
    CatalogColumn("app", "users", "id", True),
    CatalogColumn("app", "users", "email", False),
    CatalogColumn("app", "orders", "id", True),
    CatalogColumn("hidden", "users", "email", False),
]
ALL = TableFilter(["*.*"], ["hidden.*"])


def test_the_catalog_check_names_what_is_missing_or_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ok = transforms({"column": "app.users.email", "action": "mask"},
                    {"column": "*.*.id", "action": "hash"},
                    {"column": "*.*.ssn", "action": "drop"})  # fmt: skip
    assert check_catalog(ok, CATALOG, ALL) == {"app.users.email": 1, "*.*.id": 2, "*.*.ssn": 0}
    assert "'*.*.ssn' matches no column" in caplog.text
    cases = [
        ({"column": "app.users.emial", "action": "drop"},
         re.escape("table app.users has no column 'emial' (its columns: id, email)")),
        ({"column": "app.user.email", "action": "drop"}, "no streamed table app.user"),
        ({"column": "hidden.users.email", "action": "drop"}, "filters leave it out"),
        ({"column": "app.*.id", "action": "redact"}, r"app\.(users|orders)\.id, a key column"),
    ]  # fmt: skip
    shadowed = transforms({"column": "*.*.email", "action": "mask"},
                          {"column": "app.users.email", "action": "redact"})  # fmt: skip
    with pytest.raises(ConfigError, match=r"'app.users.email' never applies: the earlier rule"):
        check_catalog(shadowed, CATALOG, ALL)
    for rule, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_catalog(transforms(rule), CATALOG, ALL)
