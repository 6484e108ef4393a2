"""Regenerates ``tests/unit/data/debezium_<version>_types.json``: rows of many column types
written through the real Debezium PostgreSQL connector (the local stack's optional
``debezium`` component), with each column's type, type modifier and text output as the
replication connection writes it. The unit tests of ``shared.formats.debezium`` replay it.

    .venv/bin/python -m tests.debezium_capture
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg

from tests import debezium

COLUMNS = """id int PRIMARY KEY, s smallint, i int, bi bigint, r real, d double precision,
  n numeric(10,2), n0 numeric(5), nn numeric, b boolean, t text, vc varchar(5), ch char(3),
  by bytea, dt date, tm time, tm3 time(3), tmtz timetz, ts timestamp, ts1 timestamp(1),
  ts3 timestamp(3), tstz timestamptz, iv interval, u uuid, j json, jb jsonb, e inet,
  m money, x xml, bit3 bit(3), ai int[], at text[]"""

ROWS = [
    """(1, 2, 3, 4, 1.5, 2.25, 12345.67, 0, 3.14159, true, 'txt', 'abc', 'ab', '\\x0102ff',
       '2024-02-29', '13:45:56.123456', '13:45:56.5', '13:45:56+02', '2024-02-29 13:45:56.123456',
       '2024-02-29 13:45:56.5', '2024-02-29 13:45:56.123', '2024-02-29 13:45:56.123456+00',
       '1 day 2 hours', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": 1}', '{"b": [1,2]}',
       '10.0.0.1', 12.5, '<a/>', B'101', '{1,2}', '{"x","y"}')""",
    """(2, -32768, -1, 9223372036854775807, 'NaN', '-Infinity', -12.5, 99999, 'NaN', false,
       'éx', '', ' ', '\\x', '-infinity', '00:00:00', '00:00:00.001', '23:59:59.999999-08',
       '0001-01-01 00:00:00', '1999-01-01', '2024-02-29 13:45:56.1235',
       '2024-02-29 13:45:56.5+05:30', '1 mon 2 days 00:00:01.5', NULL, '[]', '{}', '::1',
       -3, NULL, B'000', '{}', '{NULL,"a b"}')""",
    """(3, NULL, NULL, NULL, NULL, NULL, 0.001, NULL, 1e-20, NULL, NULL, NULL, NULL, NULL,
       '0044-03-15 BC', NULL, NULL, NULL, NULL, NULL, NULL, 'infinity', '-1 year', NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL)""",
]

SESSION = ("TimeZone=UTC", "DateStyle=ISO", "IntervalStyle=iso_8601", "extra_float_digits=3")


def capture(env: dict[str, str]) -> dict[str, Any]:
    url = debezium.ensure_running()
    name = f"t_dbzcapture_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(env["WALCAST_PG_DSN"], autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{name}"')
        try:
            c.execute(f'CREATE TABLE "{name}".t ({COLUMNS})')
            with debezium.connector(url, env, name, **{"schema.include.list": name}) as prefix:
                debezium.wait_for(
                    lambda: c.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [prefix]
                    ).fetchone(),
                    "the connector's slot",
                )
                for row in ROWS:
                    c.execute(f'INSERT INTO "{name}".t VALUES {row}')
                for setting in SESSION:
                    c.execute(f"SET {setting}")
                columns = c.execute(
                    "SELECT attname, format_type(atttypid, NULL), t.typname, atttypmod"
                    " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
                    " WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum",
                    [f'"{name}".t'],
                ).fetchall()
                # Each type's output function, as pgoutput sends it (a ::text cast differs:
                # booleans, inet, char(n)).
                res = c.pgconn.exec_(f'SELECT * FROM "{name}".t ORDER BY id'.encode())
                texts = [
                    [
                        None if res.get_value(r, k) is None else bytes(res.get_value(r, k)).decode()
                        for k in range(res.nfields)
                    ]
                    for r in range(res.ntuples)
                ]
                # The envelopes of an update and a delete (then its tombstone), each in
                # its own transaction.
                c.execute(f"UPDATE \"{name}\".t SET t = 'changed' WHERE id = 1")
                c.execute(f'DELETE FROM "{name}".t WHERE id = 1')
                records = debezium.read_topic(
                    env, f"{prefix}.{name}.t", lambda r: len(r) >= len(ROWS) + 3, "every change"
                )
        finally:
            c.execute(f'DROP SCHEMA "{name}" CASCADE')
    value_schema = records[0][1]["schema"]["fields"][1]["fields"]
    return {
        "debezium": records[0][1]["payload"]["source"]["version"],
        "columns": [{"name": n, "type": typname, "typmod": mod} for n, _, typname, mod in columns],
        "rows": [
            {"text": list(t), "after": r[1]["payload"]["after"]}
            for t, r in zip(texts, records[: len(ROWS)], strict=True)
        ],
        "schema": value_schema,
        "prefix": name,
        # Whole records (key, value) of the first insert, the update, the delete and its
        # tombstone.
        "records": [records[0], *records[len(ROWS) :]],
    }


def main() -> None:
    root = Path(__file__).resolve().parent
    state = root.parent / ".stack" / "walcast.env"
    env = dict(
        line.split("=", 1)
        for line in state.read_text().splitlines()
        if line and not line.startswith("#")
    )
    data = capture(env)
    out = root / "unit" / "data" / f"debezium_{data['debezium'].removesuffix('.Final')}_types.json"
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
