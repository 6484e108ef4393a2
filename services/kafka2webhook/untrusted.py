"""What a receiver or a record controls, read totally.

Every function here returns for any input and never raises: a receiver's ``Retry-After``
(seconds or an HTTP date, however large, negative or malformed), the bytes of an answer
kept for a dead letter's reason, and the values of a record that become request headers.
A hostile receiver or a forged record can then fail its own delivery, never the service.
The property tests in tests/fuzz_webhook_properties.py hold these functions to that.
"""

from __future__ import annotations

import calendar
import email.utils
import re

EXCERPT = 500
"""Characters of an answer's body kept in a dead letter's reason."""

RETRY_AFTER_CAP_S = 366 * 86_400.0
"""The longest ``Retry-After`` read (a year): the pause is clamped to
``delivery.max_backoff_s`` anyway; a larger value is read as this one."""

_DIGITS = re.compile(r"[0-9]+")  # ASCII digits only ("²".isdigit() is true)
_ID_PART = re.compile(r"[A-Za-z0-9._-]{1,128}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]{0,8192}")


def retry_after_s(value: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from ``now`` (Unix seconds), between 0 and
    :data:`RETRY_AFTER_CAP_S`: delta-seconds (ASCII digits) or an HTTP date (a past date
    is 0). None when absent or unreadable (the caller's backoff applies then)."""
    if not value:
        return None
    value = value.strip()
    if _DIGITS.fullmatch(value):
        if len(value) > 12:  # more than the cap (and int() refuses 4300+ digits)
            return RETRY_AFTER_CAP_S
        return min(float(int(value)), RETRY_AFTER_CAP_S)
    if len(value) > 64:  # no HTTP date is this long
        return None
    when = http_date(value)
    if when is None:
        return None
    return min(max(0.0, when - now), RETRY_AFTER_CAP_S)


def http_date(value: str) -> float | None:
    """An HTTP date (RFC 9110's IMF-fixdate, and the obsolete forms the email parser
    reads) as Unix seconds; None unless it is a real date in years 1970-9999."""
    try:
        parts = email.utils.parsedate_tz(value)
    except Exception:  # noqa: BLE001 - the stdlib parser is not documented total on hostile text
        return None
    if parts is None:
        return None
    year, month, day, hour, minute, second = parts[:6]
    offset = parts[9] or 0
    if not (
        1970 <= year <= 9999
        and 1 <= month <= 12
        and 1 <= day <= 31
        and 0 <= hour <= 23
        and 0 <= minute <= 59
        and 0 <= second <= 60
        and abs(offset) <= 86_400
    ):
        return None
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 1, 0)) - offset)


def clean(text: str, limit: int = EXCERPT) -> str:
    """``text`` cut to ``limit`` characters, every non-printable one (CR, LF, escapes,
    other controls) shown as ``?``: safe in a log line and a Kafka header."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def excerpt(body: bytes, limit: int = EXCERPT) -> str:
    """The start of an answer's body as text (UTF-8, undecodable bytes replaced), cleaned
    (:func:`clean`)."""
    return clean(body[: limit * 4].decode("utf-8", "replace"), limit).strip()


def id_part(raw: bytes) -> str | None:
    """A record's identifier (a header pg2kafka writes: a decimal id) when it may go into
    a ``webhook-id`` as it is: 1-128 ASCII letters, digits, ``.``, ``_`` or ``-``. None
    otherwise (non-ASCII, CR / LF, spaces, empty, too long)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    return text if _ID_PART.fullmatch(text) else None


def header_name_ok(name: str) -> bool:
    """An HTTP header name (RFC 9110 token)."""
    return _HEADER_NAME.fullmatch(name) is not None


def header_value_ok(value: str) -> bool:
    """A header value sent as it is: visible ASCII, spaces and tabs (no CR, LF, other
    controls or non-ASCII characters), at most 8 KiB."""
    return _HEADER_VALUE.fullmatch(value) is not None
