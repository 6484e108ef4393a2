from __future__ import annotations

import struct

import pytest

from services.pg2kafka import pgoutput as pg


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def tuple_data(*cols: bytes | str | None) -> bytes:
    out = struct.pack("!h", len(cols))
    for c in cols:
        if c is None:
            out += b"n"
        elif c == "u":
            out += b"u"
        else:
            assert isinstance(c, bytes)
            out += b"t" + struct.pack("!i", len(c)) + c
    return out


def test_begin_and_commit() -> None:
    b = pg.decode(b"B" + struct.pack("!QqI", 0x1_0000_0010, 1_000_000, 42))
    assert b == pg.Begin(0x1_0000_0010, 1_000_000 + pg.PG_EPOCH_OFFSET_US, 42)
    c = pg.decode(b"C" + struct.pack("!bQQq", 0, 100, 120, 5))
    assert c == pg.Commit(100, 120, 5 + pg.PG_EPOCH_OFFSET_US)


def test_relation_with_key_flags_and_catalog_namespace() -> None:
    payload = (
        b"R" + struct.pack("!I", 16384) + cstr("") + cstr("Odd Table") + b"d"
        + struct.pack("!h", 2)
        + b"\x01" + cstr("id") + struct.pack("!Ii", 23, -1)
        + b"\x00" + cstr("näme") + struct.pack("!Ii", 1043, 36)
    )  # fmt: skip
    rel = pg.decode(payload)
    assert isinstance(rel, pg.Relation)
    assert rel.schema == "pg_catalog"
    assert rel.table == "Odd Table"
    assert rel.columns[0] == pg.Column("id", 23, -1, True)
    assert rel.columns[1] == pg.Column("näme", 1043, 36, False)


def test_insert_update_delete_tuples() -> None:
    ins = pg.decode(b"I" + struct.pack("!I", 7) + b"N" + tuple_data(b"1", None, "u"))
    assert ins == pg.Insert(7, ("1", None, pg.UNCHANGED_TOAST))
    upd = pg.decode(
        b"U" + struct.pack("!I", 7) + b"K" + tuple_data(b"1", None) + b"N" + tuple_data(b"2", b"x")
    )
    assert upd == pg.Update(7, ("2", "x"), "K", ("1", None))
    upd2 = pg.decode(b"U" + struct.pack("!I", 7) + b"N" + tuple_data(b"2"))
    assert upd2 == pg.Update(7, ("2",), None, None)
    dele = pg.decode(b"D" + struct.pack("!I", 7) + b"O" + tuple_data(b"1", b"y"))
    assert dele == pg.Delete(7, "O", ("1", "y"))


def test_truncate_message_type_origin() -> None:
    t = pg.decode(b"T" + struct.pack("!ib", 2, 3) + struct.pack("!II", 5, 6))
    assert t == pg.Truncate((5, 6), True, True)
    m = pg.decode(
        b"M" + struct.pack("!bq", 1, 99) + cstr("walcast") + struct.pack("!i", 3) + b"abc"
    )
    assert m == pg.Message(True, 99, "walcast", b"abc")
    y = pg.decode(b"Y" + struct.pack("!I", 9000) + cstr("public") + cstr("mood"))
    assert y == pg.TypeMessage(9000, "public", "mood")
    o = pg.decode(b"O" + struct.pack("!q", 5) + cstr("node1"))
    assert o == pg.Origin(5, "node1")


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"Z",
        b"B\x00\x01",
        b"I" + struct.pack("!I", 1) + b"X",
        b"R" + struct.pack("!I", 1) + b"x",
    ],
)
def test_malformed_payloads_raise_decode_error(payload: bytes) -> None:
    with pytest.raises(pg.DecodeError):
        pg.decode(payload)


def test_lsn_text_round_trip() -> None:
    assert pg.format_lsn(0x16_B374D848) == "16/B374D848"
    assert pg.parse_lsn("16/B374D848") == 0x16_B374D848
    with pytest.raises(ValueError, match="not an LSN"):
        pg.parse_lsn("123")


def test_text_that_is_not_utf8_is_decoded_by_policy_and_counted() -> None:
    """A SQL_ASCII database sent bytes that are not UTF-8 and the strict decode stopped
    the stream for good. Now: the database's encoding (SQL_ASCII: Latin-1, byte for byte)
    or U+FFFD, counted."""
    latin = "été".encode("latin-1")
    message = b"I" + struct.pack("!I", 7) + b"N" + tuple_data(latin, b"ok")
    before = pg.TEXT.undecodable
    try:
        pg.TEXT.configure("SQL_ASCII", "database")
        ins = pg.decode(message)
        assert isinstance(ins, pg.Insert)
        assert ins.new == ("été", "ok")
        assert ins.new[0].encode("latin-1") == latin  # the original bytes, recoverable
        pg.TEXT.configure("SQL_ASCII", "replace")
        again = pg.decode(message)
        assert isinstance(again, pg.Insert)
        assert again.new == ("\ufffdt\ufffd", "ok")
        assert pg.TEXT.undecodable == before + 2
    finally:
        pg.TEXT.configure("SQL_ASCII", "database")
        pg.TEXT.undecodable = before
