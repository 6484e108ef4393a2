"""Structured logging: one JSON object per line (or plain text for a terminal).

Call :func:`configure_logging` once from a service's entry point. Context that belongs to
every line of a component (``service``, ``slot``...) goes in ``extra=`` or through
:func:`bind`; it appears as top-level JSON keys so log pipelines can filter on it.

Secrets: settings hold them as ``SecretStr``, which renders masked. As a second line of
defence, :func:`register_secret` adds a value that the formatters replace wherever it
appears — message, extra fields (nested too), traceback — and every line is scrubbed of
URL passwords and secret ``key=value`` pairs by pattern (:func:`shared.secrets.scrub`):
a driver's error text may echo what it was given. :func:`log_uncaught` sends exceptions
nobody caught, on any thread, through the same formatters instead of Python's default
printer, which would write them to stderr unscrubbed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

import orjson
from pydantic import BaseModel

from shared.secrets import MIN_SECRET_LENGTH, by_length, scrub, secret_values

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
_secrets: set[str] = set()
_ordered: tuple[str, ...] = ()  # _secrets longest first, what scrub() needs
_secrets_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Never print ``value``: the formatters mask it in every message and field. Values
    shorter than :data:`~shared.secrets.MIN_SECRET_LENGTH` are ignored."""
    global _ordered
    if value and len(value) >= MIN_SECRET_LENGTH:
        with _secrets_lock:
            _secrets.add(value)
            _ordered = by_length(_secrets)


def register_secrets_of(settings: BaseModel) -> None:
    """Register every secret of loaded settings (see :func:`shared.secrets.secret_values`)."""
    for value in secret_values(settings):
        register_secret(value)


def redact(text: str) -> str:
    """``text`` with every registered secret and every URL password masked."""
    return scrub(text, _ordered)


def _redact_deep(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redact_deep(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_deep(v) for v in value]
    return value


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
                doc[key] = _redact_deep(value)
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        return orjson.dumps(doc, default=lambda v: redact(str(v))).decode()


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


def log_uncaught() -> None:
    """Log exceptions nobody caught through the configured formatters (scrubbed), at
    CRITICAL with their traceback: on the main thread (the process then exits with 1, as
    it would anyway) and on any other thread. Python's default printers write them to
    stderr as they are. Called by the service entry points after :func:`configure_logging`."""
    log = logging.getLogger("walcast.uncaught")

    def on_main(
        exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        log.critical("uncaught exception", exc_info=(exc_type, exc, tb))

    def on_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or isinstance(args.exc_value, SystemExit):
            return
        name = args.thread.name if args.thread is not None else "?"
        log.critical(
            "uncaught exception in thread %s",
            name,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = on_main
    threading.excepthook = on_thread


class bind(logging.LoggerAdapter[logging.Logger]):  # noqa: N801 - reads like a function
    """A logger that adds fixed fields to every record: ``log = bind(log, slot="s1")``."""

    def __init__(self, logger: logging.Logger, **fields: Any) -> None:
        super().__init__(logger, fields)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


class SampledLog:
    """Warnings about records that may repeat millions of times (dead letters, values
    kept as text): the first ``sample`` of each ``every_s`` window are logged in full, the
    rest only counted; when the window ends, one line gives how many were not shown, the
    rate and the most frequent reasons. A flood of bad records costs a line per window,
    not a line per record (one run wrote 779,071 dead-letter lines, ~151 MB, in five
    minutes). Counting for metrics is the caller's business.

    Thread-safe. ``tick()`` closes a finished window without a new record (callers with a
    loop call it there), so the summary of a burst is not held back until the next one.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        sample: int = 5,
        every_s: float = 30.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.logger, self.what = logger, what
        self.sample, self.every_s, self.clock = sample, every_s, clock
        self._lock = threading.Lock()
        self._start = clock()
        self._shown = 0
        self._hidden = 0
        self._reasons: dict[str, int] = {}

    def warning(self, reason: str, msg: str, *args: Any) -> None:
        """One occurrence: ``reason`` is its kind (grouped in the summary), ``msg`` and
        ``args`` the full line when it is shown."""
        with self._lock:
            self._roll(self.clock())
            if self._shown < self.sample:
                self._shown += 1
                show = True
            else:
                self._hidden += 1
                self._reasons[reason] = self._reasons.get(reason, 0) + 1
                show = False
        if show:
            self.logger.warning(msg, *args)
            if self._shown == self.sample:
                self.logger.warning(
                    "more %s in the next %.0fs are counted, not logged each", self.what,
                    self.every_s,
                )  # fmt: skip

    def tick(self) -> None:
        with self._lock:
            self._roll(self.clock())

    def _roll(self, now: float) -> None:
        elapsed = now - self._start
        if elapsed < self.every_s:
            return
        if self._hidden:
            top = sorted(self._reasons.items(), key=lambda kv: -kv[1])[:3]
            self.logger.warning(
                "%d more %s in the last %.0fs (%.1f/s), not logged each; most: %s",
                self._hidden, self.what, elapsed, self._hidden / elapsed,
                "; ".join(f"{n} x {r[:200]}" for r, n in top),
            )  # fmt: skip
        self._start, self._shown, self._hidden = now, 0, 0
        self._reasons.clear()
