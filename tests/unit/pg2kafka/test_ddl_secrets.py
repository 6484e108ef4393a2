"""DDL statement text loses the literals that hold secrets, and nothing else."""

from __future__ import annotations

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.changes import EventBuilder
from services.pg2kafka.ddl_secrets import scrub_statement
from services.pg2kafka.settings import Pg2KafkaSettings
from services.pg2kafka.types import TypeRegistry


@pytest.mark.parametrize(
    ("sql", "want"),
    [
        (
            "ALTER TABLE t ADD c int; ALTER ROLE x PASSWORD 'hunter2'",
            "ALTER TABLE t ADD c int; ALTER ROLE x PASSWORD '***'",
        ),
        (
            "CREATE ROLE x LOGIN ENCRYPTED PASSWORD 'it''s s3cret' VALID UNTIL '2030-01-01'",
            "CREATE ROLE x LOGIN ENCRYPTED PASSWORD '***' VALID UNTIL '2030-01-01'",
        ),
        (
            "alter user x with password E'a\\'b''c\\\\' login",
            "alter user x with password '***' login",
        ),
        ("ALTER ROLE x PASSWORD $$a'b$$", "ALTER ROLE x PASSWORD '***'"),
        ("ALTER ROLE x PASSWORD $pw$a$$b$pw$ LOGIN", "ALTER ROLE x PASSWORD '***' LOGIN"),
        ("ALTER ROLE x PASSWORD U&'d\\0061t'", "ALTER ROLE x PASSWORD '***'"),
        ("ALTER ROLE x PASSWORD /* c */ 'ab'\n'cd'", "ALTER ROLE x PASSWORD /* c */ '***'\n'***'"),
        ("ALTER ROLE x PASSWORD 'cut sho", "ALTER ROLE x PASSWORD '***'"),  # 10,000 chars
        (
            "CREATE USER MAPPING FOR u SERVER s OPTIONS (user 'bob', password 'pw')",
            "CREATE USER MAPPING FOR u SERVER s OPTIONS (user 'bob', password '***')",
        ),
        (
            "ALTER USER MAPPING FOR u SERVER s OPTIONS (SET password 'a', ADD \"password\" 'b')",
            "ALTER USER MAPPING FOR u SERVER s"
            " OPTIONS (SET password '***', ADD \"password\" '***')",
        ),
        (
            "CREATE SERVER s FOREIGN DATA WRAPPER w OPTIONS (host 'h', sslpassword 'pw')",
            "CREATE SERVER s FOREIGN DATA WRAPPER w OPTIONS (host 'h', sslpassword '***')",
        ),
        (
            "ALTER SERVER s OPTIONS (ADD secret_access_key 'k')",
            "ALTER SERVER s OPTIONS (ADD secret_access_key '***')",
        ),
        (
            "CREATE SUBSCRIPTION s CONNECTION 'host=h password=pw' PUBLICATION p",
            "CREATE SUBSCRIPTION s CONNECTION '***' PUBLICATION p",
        ),
        (
            "DO $$BEGIN EXECUTE 'ALTER ROLE x PASSWORD ''pw'''; END$$",
            "DO $$BEGIN EXECUTE 'ALTER ROLE x PASSWORD ''***'''; END$$",
        ),
        (
            "CREATE FUNCTION f() RETURNS void AS $b$ BEGIN ALTER ROLE y PASSWORD 'pw'; END $b$",
            "CREATE FUNCTION f() RETURNS void AS $b$ BEGIN ALTER ROLE y PASSWORD '***'; END $b$",
        ),
        (
            "ALTER TABLE t ADD n text DEFAULT 'postgresql://u:pw@h/db'; -- PASSWORD 'old'",
            "ALTER TABLE t ADD n text DEFAULT 'postgresql://u:***@h/db'; -- PASSWORD '***'",
        ),
        ("ALTER ROLE x SET my.password TO 'pw'", "ALTER ROLE x SET my.password TO '***'"),
    ],
)
def test_secret_literals_are_masked(sql: str, want: str) -> None:
    assert scrub_statement(sql) == want


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE t RENAME COLUMN password TO pass_hash",
        "ALTER ROLE x PASSWORD NULL",
        "ALTER TABLE \"pass\"\"word\" ADD c text DEFAULT 'password' CHECK (c <> 'x')",
        "CREATE TABLE t (id int, note text DEFAULT E'it\\'s' COLLATE \"C\")",
        "CREATE TABLE $1 (a$b int); COMMENT ON TABLE t IS 'no secrets here'",
        "ALTER TABLE t ADD c int -- a comment",
        "CREATE TABLE t (id int) /* nested /* comment */ */",
        "CREATE TABLE naïve (ümlaut text DEFAULT 'ö')",
        "",
    ],
)
def test_everything_else_is_left_byte_for_byte(sql: str) -> None:
    assert scrub_statement(sql) == sql


def _ddl_event(scrub_secrets: bool) -> dict[str, object]:
    b = EventBuilder("db1", TypeRegistry(), scrub_secrets=scrub_secrets)
    b.begin(pg.Begin(500, 1_700_000_000_000_000, 77))
    payload = {
        "tag": "ALTER TABLE",
        "statement": "ALTER TABLE t ADD c int; ALTER ROLE app PASSWORD 'hunter2'",
        "tables": [{"schema": "public", "table": "t", "columns": [], "primary_key": []}],
        "dropped": [{"schema": "public", "table": "u"}],
    }
    events = b.ddl(pg.Message(True, 1, "walcast.ddl", orjson.dumps(payload)), 1)
    assert len(events) == 2
    for ev in events:
        assert ev["ddl"]["statement"] == events[0]["ddl"]["statement"]  # type: ignore[index]
    return events[0]["ddl"]  # type: ignore[no-any-return]


def test_ddl_events_carry_the_scrubbed_statement_unless_turned_off() -> None:
    assert _ddl_event(True)["statement"] == "ALTER TABLE t ADD c int; ALTER ROLE app PASSWORD '***'"
    assert "hunter2" in str(_ddl_event(False)["statement"])


def test_the_setting_is_on_by_default_and_can_be_turned_off() -> None:
    assert Pg2KafkaSettings().ddl.scrub_secrets is True
    assert Pg2KafkaSettings(ddl={"scrub_secrets": False}).ddl.scrub_secrets is False
