"""Which logical messages pg2kafka acts on: only those signed with the database's key."""

from __future__ import annotations

import hashlib

import pytest

from services.pg2kafka import pgoutput as pg
from services.pg2kafka.messages import MessageKey, sign

KEY = bytes(range(32))
BODY = b'{"tag": "CREATE TABLE", "tables": []}'


def message(content: bytes) -> pg.Message:
    return pg.Message(True, 1, "walcast.ddl", content)


def test_a_message_signed_with_the_key_opens_to_its_body() -> None:
    assert MessageKey(KEY).open(message(sign(KEY, BODY)), 1) == BODY


def test_the_signed_form_is_the_one_the_migration_writes() -> None:
    # V013: 'walcast-sig-v1:' || hex(sha256(key || sha256(body))) || ':' || body
    digest = hashlib.sha256(KEY + hashlib.sha256(BODY).digest()).hexdigest()
    assert sign(KEY, BODY) == b"walcast-sig-v1:" + digest.encode() + b":" + BODY


@pytest.mark.parametrize(
    "content",
    [
        BODY,  # unsigned
        sign(b"x" * 32, BODY),  # another key
        sign(KEY, BODY)[:-1] + b"!",  # body changed after signing
        sign(KEY, BODY).replace(b":", b";", 2),  # separator broken
        b"walcast-sig-v1:" + b"0" * 64 + b":" + BODY,
        b"walcast-sig-v1:",
        b"",
    ],
)
def test_anything_else_is_refused_and_counted(content: bytes) -> None:
    key = MessageKey(KEY)
    assert key.open(message(content), 1) is None
    assert key.rejected == 1


def test_without_a_key_nothing_opens() -> None:
    key = MessageKey(None)
    assert key.open(message(sign(KEY, BODY)), 1) is None
    assert key.rejected == 1


def test_a_low_watermark_opens_a_window_only_for_a_chunk_this_process_reads() -> None:
    """A low watermark walcast wrote in an earlier process (killed before its high one),
    or any not of a chunk being read now, must not open a window that never closes."""
    import threading

    import orjson

    from services.pg2kafka.incremental import WATERMARK, Incremental
    from services.pg2kafka.settings import Pg2KafkaSettings

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
    assert inc.windows == {(3, "public", "t", 7): set()}
    assert inc.window_tables == {("public", "t"): [(3, "public", "t", 7)]}
    high = pg.Message(True, 14, WATERMARK, orjson.dumps({**low, "attempt": "a1", "mark": "high"}))
    inc.watermark(None, None, 14, high)  # type: ignore[arg-type]  # an earlier attempt's
    assert inc.windows == {(3, "public", "t", 7): set()}, "closed by another attempt's mark"
