"""Request signatures receivers can verify: the Standard Webhooks scheme
(https://www.standardwebhooks.com), so its published verifiers work unchanged.

Three headers: ``webhook-id`` (the delivery's idempotency key: the same on every
redelivery of the same events), ``webhook-timestamp`` (Unix seconds when this attempt was
signed) and ``webhook-signature`` (``v1,`` + base64 of HMAC-SHA256 over
``"{id}.{timestamp}.{body}"``). A secret written ``whsec_<base64>`` is used as the bytes
it encodes (as the scheme's libraries do): strict standard base64, at least
:data:`WHSEC_MIN_BYTES` bytes once decoded (the scheme's minimum); any other secret as its
UTF-8 bytes, at least :data:`PLAIN_MIN_BYTES` of them. :func:`secret_problem` is that
check (settings run it at start-up: a secret that decodes to a short or empty key would
let anyone sign).
Receivers recompute the signature, compare in constant time and refuse timestamps older
than their tolerance (replay protection): :func:`verify` is that check, used by the tests
and shown in docs/kafka2webhook.md.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import time
from collections.abc import Mapping

WHSEC_MIN_BYTES = 24
"""Standard Webhooks: a symmetric signing secret is at least 24 random bytes."""
PLAIN_MIN_BYTES = 16
"""A secret not written ``whsec_...``: at least this many bytes (UTF-8)."""


class SignatureError(ValueError):
    """A request whose signature does not verify (what a receiver answers 401 to)."""


def secret_problem(secret: bytes) -> str | None:
    """Why ``secret`` may not sign (what to fix, never the secret itself), or None."""
    if secret.startswith(b"whsec_"):
        try:
            key = base64.b64decode(secret[6:], validate=True)
        except (binascii.Error, ValueError):
            return (
                "is whsec_ followed by something that is not standard base64 (A-Z a-z 0-9"
                " + / with = padding, nothing else): write the key's base64 after whsec_"
            )
        if len(key) < WHSEC_MIN_BYTES:
            return (
                f"decodes to {len(key)} bytes: a whsec_ secret is at least"
                f" {WHSEC_MIN_BYTES} random bytes (Standard Webhooks), e.g."
                f" whsec_$(openssl rand -base64 32)"
            )
        return None
    if secret != secret.strip():
        return (
            "starts or ends with whitespace (a newline from the file it was read from?):"
            " remove it, receivers verify with the secret as it is written"
        )
    if any(b < 0x20 or b == 0x7F for b in secret):
        return "contains control characters: use printable characters only"
    if len(secret) < PLAIN_MIN_BYTES:
        return (
            f"has {len(secret)} bytes: a signing secret is at least {PLAIN_MIN_BYTES}"
            f" (or whsec_ + base64 of at least {WHSEC_MIN_BYTES} random bytes)"
        )
    return None


@functools.lru_cache(maxsize=64)
def signing_key(secret: bytes) -> bytes:
    """The HMAC key of ``secret`` (see the module doc); ValueError for a ``whsec_`` secret
    that is not strict base64 (:func:`secret_problem` refuses it at start-up)."""
    if secret.startswith(b"whsec_"):
        return base64.b64decode(secret[6:], validate=True)
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
