"""Which settings hold a secret, how a secret is masked, and how text is scrubbed of one.

The one place these rules live; every path that can show a setting or an error to an
operator goes through it, so the rules cannot drift apart:

* the effective configuration a service logs at start (``ServiceSettings.effective``);
* every log line, tracebacks included (``shared.logs`` holds the values to scrub);
* the one-line error a command prints, and configuration errors (``shared.cli``,
  ``shared.settings``);
* Spark's own redaction of its configuration (kafka2spark sets ``spark.redaction.regex``
  from :data:`SENSITIVE_KEY_PATTERN`) and pg2kafka's scrubbing of DDL statements (option
  names are judged by :func:`is_secret_key`).

A secret is one of:

* a ``SecretStr`` value (``postgres.password``, ``kafka.sasl_password``,
  ``engine.password``, ``engine.api_key``);
* a string whose key names a secret (:func:`is_secret_key`) — what matters for the
  free-form maps ``kafka.extra`` (``sasl.password``, ``ssl.key.pem``...) and
  ``spark.conf`` (``spark.hadoop.fs.s3a.secret.key``, ``fs.s3a.access.key``...);
* the password of a URL's user info (``scheme://user:password@host``), anywhere.

Masking replaces a whole value with :data:`MASK`. Scrubbing text (:func:`scrub`) replaces
every known secret value, in the spellings it takes in messages (quoted, escaped,
percent-encoded), and by pattern URL passwords and ``key=value`` pairs whose key names a
secret: driver and server messages may echo what they were given, and a message may be
built before anyone knows it holds a secret.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from enum import Enum
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from pydantic import BaseModel, SecretStr

MASK = "***"

# Key names that hold a secret, as a regular expression Java understands too (Spark's
# spark.redaction.regex is built from it). Matched anywhere in the key, case-insensitive.
SENSITIVE_KEY_PATTERN = (
    r"secret|passw(or)?d|pwd|token|credential|jaas|oauthbearer[._-]?config"
    r"|(api|access|account|private|encryption)[._-]?key(?![a-z])|key[._-]?pem"
)
_SECRET_KEY = re.compile(SENSITIVE_KEY_PATTERN, re.IGNORECASE)
# Keys that mention a secret but hold a switch, a class, a location or a mechanism name
# (spark.security.credentials.kafka.enabled, fs.s3a.aws.credentials.provider,
# sasl.oauthbearer.token.endpoint.url): their values are not secret, and treating "true"
# as one would mask it in every log line.
_NOT_SECRET_KEY = re.compile(
    r"[._-](enabled|provider|mechanism|url|location|type|method|class|file|path)$",
    re.IGNORECASE,
)
# scheme://user:password@ — the password group is replaced.
_URL_CREDENTIALS = re.compile(
    r"(?<![a-zA-Z0-9+.\-])([a-zA-Z][a-zA-Z0-9+.\-]*+://[^\s/@:]*+:)([^\s/@]++)@"
)
# key=value where the key names a secret: libpq conninfo (password='x'), query strings
# (access_token=x), configuration dumps (sasl.password=x).
# Anchored at the start of a key (the lookbehind) and possessive, so that a long run of
# word characters without "=" costs one pass, not one per starting position.
_SECRET_PAIR = re.compile(
    r"(?<![\w.\-])([\w.\-]++)(\s*=\s*)"
    r"('(?:[^'\\]|\\.)*+'?|\"(?:[^\"\\]|\\.)*+\"?|[^\s'\",;&)}\]]++)"
)
# Shorter values are not registered: masking every "ab" in every line would destroy the
# log and protect nothing.
MIN_SECRET_LENGTH = 3


def is_secret_key(key: str) -> bool:
    """Whether a setting, option or map key names a secret (case-insensitive)."""
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET_KEY.search(key)


def mask_url(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` masked."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{MASK}@", text)


def _mask_pair(m: re.Match[str]) -> str:
    if not is_secret_key(m.group(1)) or m.group(3) in (MASK, f"'{MASK}'", f'"{MASK}"'):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{MASK}"


def scrub(text: str, values: Iterable[str] = ()) -> str:
    """``text`` with every one of ``values`` (longest first, so a secret holding another
    goes whole) and, by pattern, URL passwords and secret ``key=value`` pairs masked."""
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return _SECRET_PAIR.sub(_mask_pair, mask_url(text))


def masked(value: Any, key: str = "") -> Any:
    """A JSON-ready copy of ``value`` (settings, or anything inside them) safe to show:
    ``SecretStr`` values and values under secret keys become :data:`MASK` (an empty
    ``SecretStr`` stays empty: unset), URL passwords in strings are masked. ``key`` is
    the name ``value`` is stored under."""
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""  # unset shows as unset
    if isinstance(value, BaseModel):
        return {name: masked(getattr(value, name), name) for name in type(value).model_fields}
    if isinstance(value, dict):
        return {str(k): masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [masked(v, key) for v in value]
    if isinstance(value, str):
        return MASK if is_secret_key(key) else mask_url(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Enum):
        return value.value
    return str(value)  # paths and any other scalar, as their text


def secret_values(value: Any, key: str = "") -> set[str]:
    """Every secret in ``value`` (loaded settings) as the text it may appear as in a
    message: raw, quoted or escaped (repr, JSON, libpq, JAAS), percent-encoded. What the
    log scrubbing replaces; values under :data:`MIN_SECRET_LENGTH` characters are left out."""
    found: set[str] = set()
    _collect(value, key, found)
    spellings: set[str] = set()
    for secret in found:
        if len(secret) >= MIN_SECRET_LENGTH:
            spellings.update(_spellings(secret))
    return spellings


def _collect(value: Any, key: str, found: set[str]) -> None:
    if isinstance(value, SecretStr):
        found.add(value.get_secret_value())
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _collect(getattr(value, name), name, found)
    elif isinstance(value, dict):
        for k, v in value.items():
            _collect(v, str(k), found)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            _collect(v, key, found)
    elif isinstance(value, str):
        if is_secret_key(key):
            found.add(value)
        found.update(url_passwords(value))


def url_passwords(text: str) -> set[str]:
    """The passwords of the URLs with user info in ``text``, as written and decoded."""
    out: set[str] = set()
    for m in _URL_CREDENTIALS.finditer(text):
        written = m.group(2)
        out.add(written)
        out.add(unquote(written))
        try:
            parsed = urlsplit(m.group(0) + "host").password
        except ValueError:
            parsed = None
        if parsed:
            out.add(parsed)
    return out


def _spellings(secret: str) -> set[str]:
    backslashed = secret.replace("\\", "\\\\")
    return {
        secret,
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        backslashed.replace('"', '\\"'),
        backslashed.replace("'", "\\'"),
        quote(secret, safe=""),
    }


def by_length(values: Iterable[str]) -> tuple[str, ...]:
    """``values`` longest first, the order :func:`scrub` needs."""
    return tuple(sorted(set(values), key=len, reverse=True))
