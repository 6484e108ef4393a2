"""Transform rules against real Postgres and Kafka: snapshot rows, inserts, updates with
old images, deletes, keys and DDL events leave the database rewritten, and no plain value
of a protected column reaches the topic; a rule naming nothing, or one that would break a
key, stops pg2kafka with what to fix. (The rules' logic: tests/unit/pg2kafka/test_transforms.py.)"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Any

import orjson
import pytest

from services.pg2kafka import admin
from shared.errors import ConfigError, PermanentError
from tests.integration.conftest import Harness, HarnessFactory, data

KEY = "integration-hash-key-0123"


def hexmac(value: str) -> str:
    return hmac.new(KEY.encode(), value.encode(), hashlib.sha256).hexdigest()


def rules(schema: str) -> dict[str, Any]:
    return {
        "hash_key": KEY,
        "rules": [
            {"column": f"{schema}.people.id", "action": "hash"},
            {"column": f"{schema}.people.email", "action": "fake", "kind": "email"},
            {"column": f"{schema}.people.card", "action": "mask", "keep": 4},
            {"column": f"{schema}.people.note", "action": "drop"},
            {"column": f"{schema}.people.born", "action": "null"},
            {"column": f"{schema}.*.secret", "action": "redact", "value": "<gone>"},
            {"column": f"{schema}.plain.*", "action": "hash"},
        ],
    }


def started(make_harness: HarnessFactory, schema: str, **transforms: Any) -> Harness:
    h = make_harness(
        init=False,
        filters={"include": [f"{schema}.*"]},
        snapshot={"mode": "initial", "workers": 1},
        transforms=transforms or rules(schema),
    )
    h.sql(f"CREATE SCHEMA {schema}")
    h.sql(f"CREATE TABLE {schema}.people (id int PRIMARY KEY, email text, card text,"
          " note text, born date)")  # fmt: skip
    h.sql(f"ALTER TABLE {schema}.people REPLICA IDENTITY FULL")  # old images: every column
    # Only types Postgres writes as JSON itself (the snapshot's fast path, without rules).
    h.sql(f"CREATE TABLE {schema}.plain (id int PRIMARY KEY, email text)")
    h.sql(f"INSERT INTO {schema}.plain VALUES (7, 'plain@corp.example.org')")
    h.sql(f"INSERT INTO {schema}.people VALUES (1, 'ann@corp.example.org', '4111111111111111',"
          " 'private note one', '1980-01-02')")  # fmt: skip
    admin.init(h.settings)
    h.start()
    return h


def test_every_event_leaves_the_database_rewritten(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"t_{unique_name}"
    h = started(make_harness, schema)
    h.events(lambda seen: len([e for e in seen if e["op"] == "read"]) >= 2, timeout=120)
    (plain,) = [e for e in h.seen if e["op"] == "read" and e["table"] == "plain"]
    assert plain["key"] == {"id": hexmac("7")}
    assert plain["new"] == {"id": hexmac("7"), "email": hexmac("plain@corp.example.org")}
    h.sql(f"INSERT INTO {schema}.people VALUES (2, 'bob@corp.example.org', '5500000000000004',"
          " 'private note two', '1990-03-04')")  # fmt: skip
    h.sql(f"UPDATE {schema}.people SET card = '4000000000000002' WHERE id = 1")
    h.sql(f"DELETE FROM {schema}.people WHERE id = 2")
    h.sql(f"ALTER TABLE {schema}.people ADD COLUMN secret text")
    h.sql(f"INSERT INTO {schema}.people VALUES (3, 'cy@x.io', '1', 'n', NULL, 'top secret')")
    h.events(lambda seen: any(e["new"] and e["new"].get("secret") for e in data(seen, "people")))
    evs = data(h.seen, "people")
    by_op: dict[str, Any] = {}
    for e in evs:
        by_op.setdefault(e["op"], e)  # the first of each
    read, insert, update, delete = (by_op[o] for o in ("read", "insert", "update", "delete"))

    assert read["key"] == {"id": hexmac("1")}
    assert read["new"]["card"] == "************1111"
    assert re.fullmatch(r"[a-z0-9]{3}@[a-z]{4}\.[a-z]{7}\.org", read["new"]["email"])
    assert read["new"]["born"] is None
    assert "note" not in read["new"]
    assert read["types"] == {"id": "text", "email": "text", "card": "text", "born": "date"}
    # The same input gives the same fake whether it came by snapshot or by stream.
    assert update["old"]["email"] == read["new"]["email"]
    assert update["old"]["card"] == "************1111"
    assert update["new"]["card"] == "************0002"
    assert insert["key"] == delete["key"] == {"id": hexmac("2")}
    assert delete["old"]["card"] == "************0004"
    assert "note" not in delete["old"]
    assert [e["new"]["secret"] for e in evs if e["new"] and "secret" in e["new"]] == ["<gone>"]
    # The schema change's column list is the table as the rules leave it.
    (ddl,) = [e for e in h.seen if e["op"] == "ddl" and e["table"] == "people"]
    columns = {c["name"]: c for c in ddl["ddl"]["columns"]}
    assert set(columns) == {"id", "email", "card", "born", "secret"}
    assert columns["email"]["type"] == columns["secret"]["sql_type"] == "text"
    assert columns["born"]["nullable"] is True

    # Nothing protected travels in the clear, anywhere in the topic.
    everything = orjson.dumps(h.seen).decode()
    for clear in ("ann@corp", "bob@corp", "plain@corp", "4111111111111111",
                  "5500000000000004", "private note", "top secret", "1980-01-02"):  # fmt: skip
        assert clear not in everything, clear


def test_a_rule_naming_no_column_stops_the_start(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"t_{unique_name}"
    h = started(
        make_harness, schema, rules=[{"column": f"{schema}.people.emial", "action": "drop"}]
    )
    assert h.thread is not None
    h.thread.join(60)
    assert not h.thread.is_alive(), "pg2kafka kept running with a rule naming no column"
    with pytest.raises(ConfigError, match=rf"table {schema}\.people has no column 'emial'"):
        h.stop()
    h.error.clear()  # seen: the teardown stops it without raising it again


def test_a_new_key_under_a_non_hash_rule_stops_the_stream_before_its_rows(
    make_harness: HarnessFactory, unique_name: str
) -> None:
    schema = f"t_{unique_name}"
    h = started(make_harness, schema, rules=[
        {"column": f"{schema}.people.card", "action": "mask", "keep": 4}])  # fmt: skip
    h.events(lambda seen: any(e["op"] == "read" for e in seen), timeout=120)
    h.sql(f"ALTER TABLE {schema}.people DROP CONSTRAINT people_pkey,"
          " ADD PRIMARY KEY (card)")  # fmt: skip
    h.sql(f"INSERT INTO {schema}.people VALUES (9, 'x@y.z', '4242424242424242', 'n', NULL)")
    assert h.thread is not None
    h.thread.join(90)
    assert not h.thread.is_alive(), "pg2kafka went on with a masked key column"
    with pytest.raises(PermanentError, match=rf"{schema}\.people\.card, a key column"):
        h.stop()
    h.error.clear()
    until = time.monotonic() + 3  # whatever reached the topic is read
    h.events(lambda seen: time.monotonic() > until)
    # The schema change went out (its columns as the rules leave them); the first row
    # under the new key stopped the stream before it was sent.
    ops = [e["op"] for e in h.seen if e.get("table") == "people"]
    assert ops == ["snapshot", "read", "snapshot", "ddl"]
