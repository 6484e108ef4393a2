from __future__ import annotations

import orjson
import pytest

from services.pg2kafka._native import convert_value
from services.pg2kafka.types import TypeInfo, TypeRegistry


@pytest.mark.parametrize(
    ("oid", "text", "expected"),
    [
        (16, "t", True),
        (16, "f", False),
        (20, "-9223372036854775808", -9223372036854775808),
        (1700, "12345678901234567890.000000001", "12345678901234567890.000000001"),
        (1700, "NaN", "NaN"),
        (701, "1.5", 1.5),
        (701, "Infinity", "Infinity"),
        (700, "NaN", "NaN"),
        (3802, '{"a": [1, 2.5, null]}', {"a": [1, 2.5, None]}),
        (17, "\\x00ff", "AP8="),
        (1082, "2024-02-29", "2024-02-29"),
        (1114, "2024-02-29 13:14:15.123456", "2024-02-29T13:14:15.123456"),
        (1184, "2024-02-29 13:14:15.5+00", "2024-02-29T13:14:15.5+00:00"),
        (1184, "2024-02-29 13:14:15+05:30", "2024-02-29T13:14:15+05:30"),
        (1184, "infinity", "infinity"),
        # years before 1 AD and after 9999: ISO-8601 expanded, astronomical numbering
        (1082, "0044-03-15 BC", "-0043-03-15"),
        (1082, "0001-01-01 BC", "0000-01-01"),
        (1082, "12345-01-01", "+12345-01-01"),
        (1082, "-infinity", "-infinity"),
        (1114, "0044-03-15 12:00:00 BC", "-0043-03-15T12:00:00"),
        (1114, "12345-06-07 01:02:03.5", "+12345-06-07T01:02:03.5"),
        (1114, "infinity", "infinity"),
        (1184, "0044-03-15 12:00:00+00 BC", "-0043-03-15T12:00:00+00:00"),
        (1184, "-infinity", "-infinity"),
        (2950, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        (1007, "{1,2,NULL}", [1, 2, None]),
        (1009, '{"a b","c\\"d",NULL,"NULL"}', ["a b", 'c"d', None, "NULL"]),
        (1007, "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
        (1007, "{}", []),
        (1007, "[0:1]={7,8}", [7, 8]),
        (3807, '{"{\\"a\\": 1}"}', [{"a": 1}]),
    ],
)
def test_builtin_conversions(oid: int, text: str, expected: object) -> None:
    # as the event carries it (JSON values are embedded as the server's text)
    assert orjson.loads(orjson.dumps(TypeRegistry().convert(oid, text))) == expected


@pytest.mark.parametrize("oid", [114, 3802])
def test_json_passes_through_exactly(oid: int) -> None:
    """Through a float parser, 12345678901234567.89 became 1.2345678901234568e16, big
    integers floats, and 1e309 an error that stopped the stream."""
    text = '{"price": 12345678901234567.89, "id": 123456789012345678901234567890, "x": 1e309}'
    assert convert_value(TypeRegistry().spec(oid), text) == text.encode()
    # json (not jsonb) keeps the client's layout: line breaks between tokens become spaces,
    # so the event stays one line
    spread = '{\n  "a": [1,\r\n 2]\n}'
    out = convert_value(TypeRegistry().spec(114), spread)
    assert b"\n" not in out
    assert orjson.loads(out) == {"a": [1, 2]}


def test_unknown_types_are_looked_up_once() -> None:
    calls: list[int] = []
    infos = {
        90001: TypeInfo(90001, "mood", "e", 0, 0),
        90002: TypeInfo(90002, "_mood", "b", 0, 90001),
        90003: TypeInfo(90003, "posint", "d", 23, 0),
        90004: TypeInfo(90004, "_posint", "b", 0, 90003),
        90005: TypeInfo(90005, "box", "b", 0, 0, ";"),
    }

    def lookup(oid: int) -> TypeInfo | None:
        calls.append(oid)
        return infos.get(oid)

    reg = TypeRegistry(lookup)
    assert reg.convert(90001, "happy") == "happy"
    assert reg.convert(90002, "{happy,sad}") == ["happy", "sad"]
    assert reg.convert(90003, "42") == 42  # a domain converts as its base type
    assert reg.convert(90004, "{1,NULL}") == [1, None]
    assert reg.convert(90003, "43") == 43
    assert calls.count(90003) == 1
    assert reg.convert(99999, "whatever") == "whatever"  # unknown to pg_type: text
    reg.named(90003, "posint")
    reg.convert(90003, "1")
    assert calls.count(90003) == 2


def test_type_names_are_pg_type_names_for_builtins_arrays_and_the_rest() -> None:
    infos = {90001: TypeInfo(90001, "mood", "e", 0, 0)}
    reg = TypeRegistry(infos.get)
    assert reg.name(23) == "int4"
    assert reg.name(1187) == "_interval"  # once labelled "1187" (issue 15)
    assert reg.name(1270) == "_timetz"
    assert reg.name(869) == "inet"
    assert reg.name(90001) == "mood"
    assert reg.name(99999) == "99999"  # unknown to the server too
    reg.named(90001, "feeling")  # a Type message renames it
    assert reg.name(90001) == "feeling"


def test_array_literals_that_are_not_arrays_do_not_convert() -> None:
    with pytest.raises(ValueError, match="malformed"):
        convert_value("a,i", "1,2")
    with pytest.raises(ValueError, match="unterminated"):
        convert_value("a,i", "{1,2")
    with pytest.raises(ValueError, match="unterminated"):
        convert_value("a,s", '{"a\\')  # a backslash at the very end
    with pytest.raises(ValueError, match="not an integer"):
        convert_value("a,i", "{1,x}")  # an element that does not convert: the whole value
