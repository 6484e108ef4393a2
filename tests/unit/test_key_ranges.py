"""Key ranges of a snapshot of key ranges (shared/contract/keyranges.py): the shape the end
marker carries, checked in one place and refused with the reason; the marker passes the
JSON Schema and the decoder, a malformed one neither; each sink's rendering of the ranges
(a search query, Spark SQL) selects exactly the keys lower < key <= upper, in the tuple's
order, checked here against Python's own tuple order over a grid of keys."""

from __future__ import annotations

import itertools
import json
import operator
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pyspark.sql import types as T  # noqa: N812 - as the services write it

from services.kafka2search.key_ranges import ranges_query
from services.kafka2spark.tables import key_ranges_sql
from shared.contract import event, keyranges

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "shared/schemas/change_event.v1.json").read_text()
)
U1 = "0a0c1d6e-0000-4000-8000-000000000001"
U2 = "f00c1d6e-0000-4000-8000-000000000002"


def marker(**snapshot: Any) -> dict[str, Any]:
    return {
        "v": 1, "op": "snapshot", "db": "d", "schema": "s", "table": "t", "lsn": 1023,
        "seq": 0, "commit_lsn": 1023, "xid": 0, "commit_ts": "2026-11-27T10:00:00Z",
        "key": {}, "new": None, "old": None, "snapshot": snapshot,
    }  # fmt: skip


GOOD = {"columns": ["a", "b"], "ranges": [[None, [1, 2]], [[1, 2], [3, -4]], [[7, 0], None]]}


def test_good_key_ranges_pass_the_schema_and_the_decoder() -> None:
    ev = marker(id=9, phase="range_end", rows=3, key_ranges=GOOD)
    jsonschema.validate(ev, SCHEMA)
    view = event.decode(json.dumps(ev).encode())
    assert view.snapshot["key_ranges"] == GOOD
    parsed = keyranges.parse(GOOD)
    assert parsed.columns == ("a", "b")
    assert parsed.ranges[1] == ((1, 2), (3, -4))
    assert parsed.as_json() == GOOD
    empty = keyranges.parse({"columns": ["a"], "ranges": [[[5], [5]], [[6], [1]]]})
    assert empty.ranges == (((5,), (5,)), ((6,), (1,)))  # accepted: they select nothing
    uuids = {"columns": ["u"], "ranges": [[[U1], [U2]]]}
    assert keyranges.parse(uuids).ranges == (((U1,), (U2,)),)
    texts = {"columns": ["t"], "ranges": [[["", "x" * 8191], ["'); DROP TABLE x; --", "é"]]]}
    with pytest.raises(ValueError, match="list of 1 key value"):
        keyranges.parse(texts)  # two values for one column
    texts["columns"] = ["t", "u"]
    assert keyranges.parse(texts).ranges[0][1] == ("'); DROP TABLE x; --", "é")


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        pytest.param(None, "'key_ranges' is not an object", id="absent"),
        pytest.param({"columns": [], "ranges": [[None, None]]}, "distinct column", id="no-col"),
        pytest.param({"columns": ["a", "a"], "ranges": [[None, None]]}, "distinct", id="dup-col"),
        pytest.param({"columns": ["a"], "ranges": []}, "1 to 10000 ranges", id="no-range"),
        pytest.param({"columns": ["a"], "ranges": [[1, 2]]}, "bound is not null or a list",
                     id="scalar-bound"),
        pytest.param({"columns": ["a"], "ranges": [[[1]]]}, "not a [lower, upper] pair",
                     id="half-range"),
        pytest.param({"columns": ["a"], "ranges": [[[1, 2], None]]}, "list of 1 key value",
                     id="wide-bound"),
        pytest.param({"columns": ["a"], "ranges": [[["x" * 8192], None]]}, "longer than 8191",
                     id="long-text"),
        pytest.param({"columns": ["a"], "ranges": [[["a\x00b"], None]]}, "NUL", id="nul"),
        pytest.param({"columns": ["a"], "ranges": [[[1.5], None]]}, "neither", id="float"),
        pytest.param({"columns": ["a"], "ranges": [[[True], None]]}, "neither", id="bool"),
        pytest.param({"columns": ["a"], "ranges": [[[2**63], None]]}, "outside a bigint",
                     id="huge"),
        pytest.param({"columns": ["a"], "ranges": [[None, [None]]]}, "neither", id="null-value"),
    ],
)  # fmt: skip
def test_bad_key_ranges_are_refused_with_the_reason(bad: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        keyranges.parse(bad)
    ev = marker(id=9, phase="range_end", rows=0, key_ranges=bad)
    with pytest.raises(event.EventDecodeError, match=re.escape(reason)):
        event.decode(json.dumps(ev).encode())


def test_a_range_end_marker_without_its_ranges_is_refused_by_the_schema() -> None:
    with pytest.raises(jsonschema.ValidationError, match="'key_ranges' is a required"):
        jsonschema.validate(marker(id=9, phase="range_end", rows=0), SCHEMA)


# -- each sink's rendering, against Python's tuple order ---------------------------------

GRID = list(itertools.product(range(0, 5), range(0, 4)))
RANGES = keyranges.parse(
    {"columns": ["a", "b"], "ranges": [[[0, 2], [1, 1]], [[3, 3], None], [None, [0, 0]]]}
)


def inside(key: tuple[int, int]) -> bool:
    return any(
        (lo is None or key > lo) and (hi is None or key <= hi)  # type: ignore[operator]
        for lo, hi in RANGES.ranges
    )


def matches_search(q: dict[str, Any], doc: dict[str, Any]) -> bool:
    """A tiny evaluator of the query shapes ranges_query builds."""
    ((kind, body),) = q.items()
    if kind == "match_all":
        return True
    if kind == "term":
        ((c, v),) = body.items()
        return doc[c] == v
    if kind == "range":
        ((c, ops),) = body.items()
        tests = {"gt": operator.gt, "lt": operator.lt, "lte": operator.le, "gte": operator.ge}
        return all(tests[op](doc[c], v) for op, v in ops.items())
    assert kind == "bool"
    ok = all(matches_search(f, doc) for f in body.get("filter", []))
    if "should" in body:
        ok = ok and sum(matches_search(s, doc) for s in body["should"]) >= body.get(
            "minimum_should_match", 1
        )
    return ok


def test_the_search_query_selects_exactly_the_keys_in_the_ranges() -> None:
    q = ranges_query(RANGES)
    chosen = {k for k in GRID if matches_search(q, {"a": k[0], "b": k[1]})}
    assert chosen == {k for k in GRID if inside(k)}
    assert chosen  # the grid meets the ranges


def test_spark_sql_selects_exactly_the_keys_in_the_ranges() -> None:
    where = key_ranges_sql(["a", "b"], RANGES)
    # Spark SQL's boolean syntax here is Python's once the operators are spelled so.
    expr = where.replace("`", "").replace(" OR ", " or ").replace(" AND ", " and ")
    expr = expr.replace(" = ", " == ").replace("TRUE", "True")
    chosen = {k for k in GRID if eval(expr, {}, {"a": k[0], "b": k[1]})}  # noqa: S307 - test
    assert chosen == {k for k in GRID if inside(k)}


def test_spark_sql_writes_string_bounds_as_the_hex_of_their_bytes() -> None:
    evil = "'); DROP TABLE x; -- \\' é"
    ranges = keyranges.parse({"columns": ["u"], "ranges": [[[U1], [evil]]]})
    where = key_ranges_sql(["u"], ranges)
    assert where == (
        f"(`u` > CAST(X'{U1.encode().hex()}' AS STRING)"
        f" AND `u` <= CAST(X'{evil.encode().hex()}' AS STRING))"
    )
    assert "DROP" not in where  # no character of a value reaches the statement


# Strings order by code point (UTF-8's byte order): upper case before lower, accents and
# other scripts after ASCII — the order a collation like en_US would not give.
WORDS = ["", " ", "A", "B", "Z", "a", "aa", "ab", "b", "z", "\u00e9", "\u00e9a", "\u65e5",
         "\U0001f600", "~"]  # fmt: skip
TEXT_RANGES = keyranges.parse(
    {"columns": ["t"], "ranges": [[["B"], ["ab"]], [["\u00e9"], ["\U0001f600"]], [None, [" "]]]}
)


def in_text_ranges(word: str) -> bool:
    return any(
        (lo is None or word > lo[0]) and (hi is None or word <= hi[0])  # type: ignore[operator]
        for lo, hi in TEXT_RANGES.ranges
    )


def test_text_key_ranges_select_by_code_point_in_both_sinks() -> None:
    assert sorted(WORDS, key=lambda w: w.encode()) == sorted(WORDS)  # code point = bytes
    want = {w for w in WORDS if in_text_ranges(w)}
    assert want == {"", " ", "Z", "a", "aa", "ab", "\u00e9a", "\u65e5", "\U0001f600"}
    q = ranges_query(TEXT_RANGES, ["t.keyword"])
    assert {w for w in WORDS if matches_search(q, {"t.keyword": w})} == want
    where = key_ranges_sql(["t"], TEXT_RANGES)

    def unhex(m: re.Match[str]) -> str:
        return repr(bytes.fromhex(m.group(1)).decode())

    expr = re.sub(r"CAST\(X'([0-9a-f]*)' AS STRING\)", unhex, where)
    expr = expr.replace("`", "").replace(" OR ", " or ").replace(" AND ", " and ")
    chosen = {w for w in WORDS if eval(expr, {}, {"t": w})}  # noqa: S307 - test
    assert chosen == want


def test_a_time_key_bound_is_cast_to_the_mirror_columns_type() -> None:
    """A date or timestamp key's bound is its text (shared/contract/keyorder.py): Spark
    compares it as the mirror column's type, a cast per column (strings stay strings)."""
    ranges = keyranges.parse(
        {"columns": ["d", "at", "k"],
         "ranges": [[["2026-01-01", "2026-01-01T10:00:00.5", "x"], None]]}
    )  # fmt: skip
    where = key_ranges_sql(
        ["d", "at", "k"], ranges, [T.DateType(), T.TimestampNTZType(), T.StringType()]
    )
    hexed = {v: v.encode().hex() for v in ("2026-01-01", "2026-01-01T10:00:00.5", "x")}
    assert f"`d` > CAST(CAST(X'{hexed['2026-01-01']}' AS STRING) AS DATE)" in where
    assert f"CAST(CAST(X'{hexed['2026-01-01T10:00:00.5']}' AS STRING) AS TIMESTAMP_NTZ)" in where
    assert f"`k` > CAST(X'{hexed['x']}' AS STRING)" in where
    aware = key_ranges_sql(["at"], keyranges.parse(
        {"columns": ["at"], "ranges": [[None, ["2026-01-01T10:00:00+00:00"]]]}), [T.TimestampType()]
    )  # fmt: skip
    assert aware.endswith(" AS STRING) AS TIMESTAMP))")
