"""Request signatures receivers can verify: the Standard Webhooks scheme
(https://www.standardwebhooks.com), so its published verifiers work unchanged.

Three headers: ``webhook-id`` (the delivery's idempotency key: the same on every
redelivery of the same events), ``webhook-timestamp`` (Unix seconds when this attempt was
signed) and ``webhook-signature`` (``v1,`` + base64 of HMAC-SHA256 over
``"{id}.{timestamp}.{body}"``). A secret written ``whsec_<base64>`` is used as the bytes
it encodes (as the scheme's libraries do); any other secret as its UTF-8 bytes.
Receivers recompute the signature, compare in constant time and refuse timestamps older
than their tolerance (replay protection): :func:`verify` is that check, used by the tests
and shown in docs/kafka2webhook.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping


class SignatureError(ValueError):
    """A request whose signature does not verify (what a receiver answers 401 to)."""


def signing_key(secret: bytes) -> bytes:
    if secret.startswith(b"whsec_"):
        return base64.b64decode(secret[6:])
    return secret


def signature(secret: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    mac = hmac.new(signing_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: bytes, msg_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
    timestamp = int(time.time() if now is None else now)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, msg_id, timestamp, body),
    }


def verify(
    secret: bytes,
    request_headers: Mapping[str, str],
    body: bytes,
    tolerance_s: int = 300,
    now: float | None = None,
) -> str:
    """The delivery's id when the request is signed with ``secret`` within
    ``tolerance_s`` of ``now``; SignatureError otherwise."""
    lower = {k.lower(): v for k, v in request_headers.items()}
    try:
        msg_id = lower["webhook-id"]
        timestamp = int(lower["webhook-timestamp"])
        given = lower["webhook-signature"]
    except (KeyError, ValueError) as exc:
        raise SignatureError(f"missing or malformed webhook headers: {exc}") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise SignatureError(f"timestamp {timestamp} is outside the tolerance ({tolerance_s} s)")
    expected = signature(secret, msg_id, timestamp, body)
    # Several signatures may be sent (space-separated) while a secret is rotated.
    if not any(hmac.compare_digest(expected, s) for s in given.split()):
        raise SignatureError("no signature matches")
    return msg_id
