"""Structured logging: one JSON object per line (or plain text for a terminal).

Call :func:`configure_logging` once from a service's entry point. Context that belongs to
every line of a component (``service``, ``slot``...) goes in ``extra=`` or through
:func:`bind`; it appears as top-level JSON keys so log pipelines can filter on it.

Secrets: settings hold them as ``SecretStr``, which renders masked. As a second line of
defence, :func:`register_secret` adds a value that the formatter replaces wherever it
appears in a message (a DSN echoed back inside a driver's error text, for example).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, TextIO

import orjson

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
_secrets: set[str] = set()
_secrets_lock = threading.Lock()
MASK = "**********"


def register_secret(value: str | None) -> None:
    """Never print ``value``: the formatter masks it in every message and field."""
    if value and len(value) >= 3:
        with _secrets_lock:
            _secrets.add(value)


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                doc[key] = redact(value) if isinstance(value, str) else value
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {
            k: v
            for k, v in record.__dict__.items()
            if k not in _STANDARD_ATTRS and not k.startswith("_")
        }
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return redact(line)


def configure_logging(level: str = "INFO", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Route the root logger to ``stream`` (stderr) in the chosen format; idempotent."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Client libraries are chatty at INFO; their warnings still come through.
    for noisy in ("kafka", "urllib3", "elastic_transport", "opensearch", "py4j"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class bind(logging.LoggerAdapter[logging.Logger]):  # noqa: N801 - reads like a function
    """A logger that adds fixed fields to every record: ``log = bind(log, slot="s1")``."""

    def __init__(self, logger: logging.Logger, **fields: Any) -> None:
        super().__init__(logger, fields)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs
