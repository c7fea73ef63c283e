"""Barge's logs (a worker's, `barge beat`'s, `barge serve`'s): JSON lines when stderr is
not a terminal, the job and shard on every line logged while a shard runs, and secrets
redacted before anything is written.

    with log_context(job_id=job_id, shard_id=shard_index):
        log.info("...")     # {"ts": ..., "level": "INFO", ..., "job_id": "...", "shard_id": 3}

NOTE: redaction is a net, not the policy. Code logs ids, counts and redacted errors,
never input text or webhook bodies; the filter additionally runs every record through
storage.redaction (URLs without userinfo, query or web path; webhook secrets, AWS keys,
Authorization values and fields named like secrets masked) and drops fields named like
row text or bodies, in case one slips in. It sits on the handler, not on a logger: a
handler's filters see every record it writes, Celery's, urllib3's and fsspec's included,
where a logger's filters would miss the records that propagate from its children. A
handler Barge did not configure (Barge as a library, uvicorn's) has no such net, so a
call that formats a URL still redacts it itself (storage.fs.redact).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from storage.redaction import HIDDEN, is_secret_name, redact_value
from storage.redaction import redact_text as redact  # noqa: F401  (the name this module's callers use)

_context: contextvars.ContextVar[dict] = contextvars.ContextVar("barge_log_context", default={})

# Attributes every LogRecord has; anything else on a record came from `extra=` or a filter.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

_CONTENT_FIELD = re.compile(r"^(body|text|texts|input|inputs|prompt|prompts|rows?)$", re.IGNORECASE)


@contextmanager
def log_context(**fields) -> Iterator[None]:
    """Add `fields` (job_id, shard_id) to every record logged in this context."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Copies the current log_context onto each record (fields the call set win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _context.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


class RedactingFilter(logging.Filter):
    """Masks secrets in the message, its arguments and every extra field; drops extra
    fields named like row content or bodies."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):   # arguments that do not fit the format: keep both, masked
            message = f"{record.msg} {record.args!r}"
        record.msg, record.args = redact(message), None
        for name in list(vars(record)):
            if name in _STANDARD_ATTRS:
                continue
            value = getattr(record, name)
            if is_secret_name(name) and value is not None:
                setattr(record, name, HIDDEN)
            elif _CONTENT_FIELD.match(name):
                setattr(record, name, "[omitted]")
            elif isinstance(value, str):
                setattr(record, name, redact(value))
            elif isinstance(value, (dict, list, tuple)):
                setattr(record, name, redact_value(json.loads(json.dumps(value, default=str))))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, then context and extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": _iso_time(record.created), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        for name, value in vars(record).items():
            if name not in _STANDARD_ATTRS and not name.startswith("_"):
                line[name] = value if _is_json(value) else str(value)
        if record.exc_info:
            line["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """The human format, with [job/shard] when set; tracebacks redacted too."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        job_id = getattr(record, "job_id", None)
        if job_id is not None:
            shard = getattr(record, "shard_id", None)
            prefix = f"[job {job_id}" + (f" shard {shard}" if shard is not None else "") + "] "
            head, sep, rest = text.partition(": ")
            text = f"{head}{sep}{prefix}{rest}"
        return redact(text)


def configure_logging(level: str | int = "INFO", fmt: str | None = None, stream=None) -> logging.Handler:
    """Send the root logger to stderr in `fmt` ("json" | "text"; default BARGE_LOG_FORMAT,
    else json unless stderr is a terminal), through the context and redaction filters."""
    stream = stream or sys.stderr
    fmt = fmt or os.environ.get("BARGE_LOG_FORMAT") or ("text" if stream.isatty() else "json")
    if fmt not in ("json", "text"):
        raise ValueError(f"BARGE_LOG_FORMAT must be 'json' or 'text', got {fmt!r}")
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "is_barge_handler", False)]:
        root.removeHandler(old)
    handler.is_barge_handler = True
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)   # Python warnings become (JSON) log lines too
    return handler


def _iso_time(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def _is_json(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, list, dict))
