"""Logging of the server: one JSON object per line on stderr.

Every record has ts (UTC, milliseconds), level, logger and msg; a record's `fields` extra
(`log.info("...", extra={"fields": {...}})`) is merged into the object, and an exception's traceback
goes under exc. docs/service.md ("Logs") describes the format.
"""

from __future__ import annotations

import errno
import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and the record's `fields` extra."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(level: str = "INFO") -> None:
    """Route every logger through one stderr handler with the JSON format, at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


# accept() errors that mean "out of a resource for now" (descriptors, buffers, memory).
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class LoopErrorLimiter:
    """An asyncio exception handler that logs each kind of error at most once per `every_s` seconds, with
    how many of that kind were left out since the last line.

    Without it, a process out of file descriptors logged every failed accept() and every connection
    that could not be set up: 316,415 ERROR lines (161 MB) in 50 s, themselves a way to fill a disk. A
    kind is the context's message and the exception's type; tracebacks are kept for errors other than
    OSError (EMFILE and its kin say all there is in one line)."""

    MAX_KINDS = 256  # distinct kinds remembered; past it the oldest is forgotten (bounded memory)

    def __init__(self, every_s: float = 10.0, logger: logging.Logger | None = None) -> None:
        self.every_s = every_s
        self.log = logger or logging.getLogger("asyncio")
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (last logged, left out since)

    def __call__(self, loop: Any, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "unhandled error in the event loop")
        exc = context.get("exception")
        kind = (message, type(exc).__name__ if exc is not None else "")
        now = time.monotonic()
        last, left_out = self._last.get(kind, (-float("inf"), 0))
        if now - last < self.every_s:
            self._last[kind] = (last, left_out + 1)
            return
        self._last.pop(kind, None)
        while len(self._last) >= self.MAX_KINDS:
            self._last.pop(next(iter(self._last)))
        self._last[kind] = (now, 0)
        fields: dict[str, Any] = {"left_out": left_out, "every_s": self.every_s}
        if exc is not None:
            fields["error"] = f"{type(exc).__name__}: {exc}"
        exc_info = None if exc is None or isinstance(exc, OSError) else (type(exc), exc, exc.__traceback__)
        # Out of descriptors or buffers at accept(): asyncio retries the accept itself a moment later and
        # the HTTP connection cap refuses the excess, so the process goes on serving: a warning (raise
        # `ulimit -n`), not an error.
        exhausted = isinstance(exc, OSError) and exc.errno in _EXHAUSTED and "accept" in message
        level = logging.WARNING if exhausted else logging.ERROR
        self.log.log(level, message, exc_info=exc_info, extra={"fields": fields})
