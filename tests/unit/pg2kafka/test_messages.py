"""Which logical messages pg2kafka acts on: only those signed with the database's key."""

from __future__ import annotations

import hashlib

import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.messages import MessageKey, sign

KEY = bytes(range(32))
BODY = b'{"tag": "CREATE TABLE", "tables": []}'


XID = 4242
PREFIX = "walcast.ddl"


def message(content: bytes, prefix: str = PREFIX) -> pg.Message:
    return pg.Message(True, 1, prefix, content)


def test_a_message_signed_with_the_key_in_its_transaction_opens_to_its_body() -> None:
    assert MessageKey(KEY).open(message(sign(KEY, PREFIX, XID, BODY)), 1, XID) == BODY


def test_the_signed_form_is_the_one_the_migration_writes() -> None:
    # V018: 'walcast-sig-v2:' || hex(sha256(key || sha256(prefix:xid:body))) || ':' || body
    inner = hashlib.sha256(f"{PREFIX}:{XID}:".encode() + BODY).digest()
    digest = hashlib.sha256(KEY + inner).hexdigest()
    assert sign(KEY, PREFIX, XID, BODY) == b"walcast-sig-v2:" + digest.encode() + b":" + BODY


def test_a_signed_message_replayed_in_another_transaction_or_prefix_is_refused() -> None:
    """Bytes copied from the WAL by a role that may read it, emitted again."""
    key = MessageKey(KEY)
    signed = sign(KEY, PREFIX, XID, BODY)
    assert key.open(message(signed), 1, XID + 1) is None
    assert key.open(message(signed, "walcast.snapshot"), 1, XID) is None
    assert key.open(message(signed), 1, None) is None  # outside a transaction
    assert key.rejected == 3


@pytest.mark.parametrize(
    "content",
    [
        BODY,  # unsigned
        sign(b"x" * 32, PREFIX, XID, BODY),  # another key
        sign(KEY, PREFIX, XID, BODY)[:-1] + b"!",  # body changed after signing
        sign(KEY, PREFIX, XID, BODY).replace(b":", b";", 2),  # separator broken
        b"walcast-sig-v2:" + b"0" * 64 + b":" + BODY,
        b"walcast-sig-v1:"
        + hashlib.sha256(KEY + hashlib.sha256(BODY).digest()).hexdigest().encode()
        + b":"
        + BODY,  # the V013 form, valid then: refused now
        b"walcast-sig-v1:",
        b"",
    ],
)
def test_anything_else_is_refused_and_counted(content: bytes) -> None:
    key = MessageKey(KEY)
    assert key.open(message(content), 1, XID) is None
    assert key.rejected == 1


def test_without_a_key_nothing_opens() -> None:
    key = MessageKey(None)
    assert key.open(message(sign(KEY, PREFIX, XID, BODY)), 1, XID) is None
    assert key.rejected == 1


def test_a_low_watermark_opens_a_window_only_for_a_chunk_this_process_reads() -> None:
    """A low watermark walcast wrote in an earlier process (killed before its high one),
    or any not of a chunk being read now, must not open a window that never closes."""
    import threading

    import orjson

    from services.pg2kafka.settings import Pg2KafkaSettings
    from services.pg2kafka.snapshots.incremental import WATERMARK, Incremental, Window

    inc = Incremental(Pg2KafkaSettings(), threading.Event())
    low = {"run": 3, "schema": "public", "table": "t", "chunk": 7, "mark": "low", "attempt": "a2"}
    msg = pg.Message(True, 10, WATERMARK, orjson.dumps(low))
    inc.watermark(None, None, 10, msg)  # type: ignore[arg-type]
    assert inc.windows == {}
    assert inc.window_tables == {}
    inc.reading[(3, "public", "t", 7)] = "a1"  # a later attempt at the same chunk
    inc.watermark(None, None, 11, msg)  # type: ignore[arg-type]
    assert inc.windows == {}
    inc.reading[(3, "public", "t", 7)] = "a2"
    inc.watermark(None, None, 12, msg)  # type: ignore[arg-type]
    inc.watermark(None, None, 13, msg)  # the same low mark streamed again
    assert inc.windows == {(3, "public", "t", 7): Window()}
    assert inc.window_tables == {("public", "t"): [(3, "public", "t", 7)]}
    high = pg.Message(True, 14, WATERMARK, orjson.dumps({**low, "attempt": "a1", "mark": "high"}))
    inc.watermark(None, None, 14, high)  # type: ignore[arg-type]  # an earlier attempt's
    assert inc.windows == {(3, "public", "t", 7): Window()}, "closed by another attempt's mark"
