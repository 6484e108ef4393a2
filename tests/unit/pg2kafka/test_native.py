"""The compiled row encoder writes what orjson writes for the same values.

Kafka keys of one row come from two writers: the row encoder (changes, snapshot rows
read by pg2kafka) and orjson over a parsed dict (snapshot rows Postgres writes as JSON):
the bytes must be equal, or one row's events land in different partitions. Values must
read back as the same numbers and strings in every consumer.
"""

from __future__ import annotations

import math
import random
import struct

import orjson
import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka._native import RowEncoder, convert_value, decode_tuple


def _doubles() -> list[float]:
    rng = random.Random(18)
    special = [0.0, -0.0, 1.0, 100.0, 0.1, 1e15, 1e16, 1.5e16, 9999999999999998.0, 1e-5,
               9.99e-6, 1e-6, 1.2345e-5, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
               3.4028234663852886e38, 1.1, 4.35, 123456789.123, 2.0**53, 2.0**53 + 2.0, 1e21, 1e22,
               1e100, 1e-300, 12.5]  # fmt: skip
    randoms = [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(3000)]
    scaled = [rng.uniform(-1, 1) * 10 ** rng.randint(-12, 20) for _ in range(3000)]
    values = special + [-v for v in special] + randoms + scaled
    return [v for v in values if math.isfinite(v)]


def test_doubles_are_written_as_orjson_writes_them() -> None:
    for v in _doubles():
        # Postgres (extra_float_digits=3) writes the shortest text that reads back exactly,
        # as repr does; the exponent's spelling differs (1e+16 / 1e+16, 1.5e-07 / 1.5e-7).
        for text in (repr(v), f"{v:.17g}"):
            assert convert_value("f", text) == orjson.dumps(v), text


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_doubles_stay_strings(text: str) -> None:
    assert convert_value("f", text) == orjson.dumps(text)


def _strings() -> list[str]:
    rng = random.Random(7)
    alphabet = [chr(c) for c in range(0x30)] + ['"', "\\", "/", "\x7f", "é", "\u2028", "😀", "a"]
    return [
        "",
        *alphabet,
        *("".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(500)),
    ]


def test_strings_and_keys_are_written_as_orjson_writes_them() -> None:
    enc = RowEncoder(["id", "s", 'we"ird\n'], ["i", "s", "s"], [True, False, True])
    for s in _strings():
        row, key, toast, kept = enc.encode(("-42", s, s))
        assert row == orjson.dumps({"id": -42, "s": s, 'we"ird\n': s})
        assert key == orjson.dumps({"id": -42, 'we"ird\n': s})
        assert toast is None
        assert kept is None


def test_a_row_leaves_out_unchanged_toast_and_nulls_its_key_when_missing() -> None:
    enc = RowEncoder(["id", "doc", "n"], ["i", "s", "i"], [True, False, True])
    row, key, toast, kept = enc.encode(("1", pg.UNCHANGED_TOAST, None))
    assert orjson.loads(row) == {"id": 1, "n": None}
    assert orjson.loads(key or b"") == {"id": 1, "n": None}
    assert toast == ["doc"]
    assert kept is None
    row, key, toast, _ = enc.encode((pg.UNCHANGED_TOAST, "x", "2"))
    assert key == b'{"id":null,"n":2}'  # a key column left out is null
    assert toast == ["id"]


def test_a_value_that_does_not_convert_is_kept_as_text_and_named() -> None:
    enc = RowEncoder(["id", "tags", "b"], ["i", "a,i", "x"], [True, False, False])
    row, key, _, kept = enc.encode(("7", "{1,oops}", "\\xzz"))
    assert orjson.loads(row) == {"id": 7, "tags": "{1,oops}", "b": "\\xzz"}
    assert key == b'{"id":7}'
    assert kept is not None
    assert [name for name, _ in kept] == ["tags", "b"]
    assert "not an integer" in kept[0][1]


def test_no_key_columns_no_key() -> None:
    _, key, _, _ = RowEncoder(["line"], ["s"], [False]).encode(("x",))
    assert key is None


@pytest.mark.parametrize(
    ("names", "specs", "key"),
    [(["a"], ["i", "s"], [False]), (["a"], ["q"], [False]), (["a"], ["a,"], [False])],
)
def test_a_bad_encoder_definition_is_refused(
    names: list[str], specs: list[str], key: list[bool]
) -> None:
    with pytest.raises(ValueError, match=r"spec|differ|kind"):
        RowEncoder(names, specs, key)


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="2 values for 1 columns"):
        RowEncoder(["a"], ["s"], [False]).encode(("x", "y"))


def _tuple(*cols: bytes) -> bytes:
    return struct.pack("!h", len(cols)) + b"".join(cols)


def _text(raw: bytes) -> bytes:
    return b"t" + struct.pack("!i", len(raw)) + raw


def test_decode_tuple_reads_text_null_and_unchanged_toast() -> None:
    buf = b"xx" + _tuple(_text("ü".encode()), b"n", b"u", _text(b""))
    values, end = decode_tuple(buf, 2, pg.UNCHANGED_TOAST, lambda raw: "never")
    assert values == ("ü", None, pg.UNCHANGED_TOAST, "")
    assert end == len(buf)


def test_decode_tuple_hands_text_that_is_not_utf8_to_the_policy() -> None:
    seen: list[bytes] = []

    def latin1(raw: bytes) -> str:
        seen.append(raw)
        return raw.decode("latin-1")

    values, _ = decode_tuple(_tuple(_text(b"caf\xe9")), 0, pg.UNCHANGED_TOAST, latin1)
    assert values == ("café",)
    assert seen == [b"caf\xe9"]


@pytest.mark.parametrize(
    ("buf", "message"),
    [
        (b"\x00", "column count"),
        (_tuple(), ""),  # no columns: fine (checked below)
        (struct.pack("!h", 1), "missing column"),
        (struct.pack("!h", 1) + b"t\x00\x00", "missing length"),
        (struct.pack("!h", 1) + b"t\x00\x00\x00\x05abc", "value of 5 bytes"),
        (struct.pack("!h", 1) + b"b", "unsupported tuple column kind"),
    ],
)
def test_decode_tuple_refuses_what_is_not_the_protocol(buf: bytes, message: str) -> None:
    if not message:
        assert decode_tuple(buf, 0, None, str) == ((), 2)
        return
    with pytest.raises(ValueError, match=message):
        decode_tuple(buf, 0, None, str)


@pytest.mark.parametrize(
    ("text", "expected"), [("007", b"7"), ("-0", b"0"), ("-012", b"-12"), ("0", b"0")]
)
def test_integers_are_written_as_numbers_whatever_their_spelling(
    text: str, expected: bytes
) -> None:
    """Postgres writes integers canonically; a JSON number never has leading zeros."""
    assert convert_value("i", text) == expected


def test_a_nesting_no_postgres_array_has_is_refused_not_a_crash() -> None:
    """Postgres arrays have at most 6 dimensions; a million levels ran the parser's
    recursion out of stack (the process died)."""
    with pytest.raises(ValueError, match="nested deeper"):
        convert_value("a,i", "{" * 1_000_000)
    assert orjson.loads(convert_value("a,i", "{" * 6 + "1" + "}" * 6)) == [[[[[[1]]]]]]


def test_unquoted_elements_lose_only_the_whitespace_postgres_trims() -> None:
    assert orjson.loads(convert_value("a,s", "{ x ,\ty\n}")) == ["x", "y"]
    # A no-break space is not whitespace to Postgres' array parser: part of the element.
    assert orjson.loads(convert_value("a,s", "{\u00a0x}")) == ["\u00a0x"]


def test_decode_tuple_refuses_a_position_past_the_buffer() -> None:
    with pytest.raises(ValueError, match="column count"):
        decode_tuple(b"abc", 2**64 - 1, None, str)
