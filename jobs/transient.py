"""Errors that pass, told apart from errors that don't.

A database restarting or unreachable, a broker connection lost, an object store's 5xx
answers or timeouts (after the client's own retries): these pass, and the work that met
them is retried (`retrying`) or left for its owner to re-drive (jobs.recovery_store),
never turned into a failed job. Everything else is deterministic (the input unreadable,
the output refused, the schema wrong) and fails the job with its reason.

`is_transient` looks at the whole chain of causes: storage wraps a backend's error in
an InputError or OutputError, SQLAlchemy wraps the driver's.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sqlalchemy import exc as sa_exc

log = logging.getLogger("barge.worker")

T = TypeVar("T")

# SQLite's OperationalError also covers a missing table or bad SQL: only these pass.
_SQLITE_TRANSIENT = ("locked", "busy", "unable to open", "disk i/o")
# S3-style error codes that mean "try again".
_RETRYABLE_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed",
                    "Throttling", "ThrottlingException", "RequestLimitExceeded", "503", "500", "502", "504"}
DEFAULT_RETRY_S = 60.0    # how long `retrying` keeps at it before leaving the work to its owner


def is_transient(error: BaseException) -> bool:
    return any(_is_transient_one(e) for e in _chain(error))


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_transient_one(error: BaseException) -> bool:
    if isinstance(error, sa_exc.DBAPIError):
        return error.connection_invalidated or (error.orig is not None and _is_transient_one(error.orig))
    if isinstance(error, (sa_exc.InterfaceError, sa_exc.TimeoutError, sa_exc.DisconnectionError)):
        return True
    if isinstance(error, sqlite3.OperationalError):
        return any(text in str(error).lower() for text in _SQLITE_TRANSIENT)
    if isinstance(error, (ConnectionError, TimeoutError)):   # sockets: refused, reset, timed out
        return True
    return _is_transient_by_library(error)


def _is_transient_by_library(error: BaseException) -> bool:
    """The optional libraries' own classes, each checked only if it is installed."""
    for module_name, class_names in (("psycopg", ("OperationalError",)),
                                     ("kombu.exceptions", ("OperationalError", "ConnectionError")),
                                     ("amqp.exceptions", ("ConnectionError", "RecoverableConnectionError")),
                                     ("redis.exceptions", ("ConnectionError", "TimeoutError", "BusyLoadingError")),
                                     ("botocore.exceptions", ("EndpointConnectionError", "ConnectionClosedError",
                                                              "ReadTimeoutError", "ConnectTimeoutError")),
                                     ("aiohttp", ("ClientConnectionError", "ServerTimeoutError"))):
        module = _module(module_name)
        if module is not None and isinstance(error, tuple(getattr(module, n) for n in class_names if hasattr(module, n))):
            return True
    response = getattr(error, "response", None)   # botocore's ClientError
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = str(response.get("Error", {}).get("Code", ""))
        return status >= 500 or status == 429 or code in _RETRYABLE_CODES
    return False


def _module(name: str):
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def retrying(step: str, action: Callable[[], T], *, within_s: float = DEFAULT_RETRY_S,
             first_delay_s: float = 0.5, max_delay_s: float = 8.0) -> T:
    """`action()`, again after a transient error, with backoff, for up to `within_s`;
    then (or at once, for an error that does not pass) the error is raised."""
    deadline = time.monotonic() + within_s
    delay_s = first_delay_s
    while True:
        try:
            return action()
        except Exception as error:
            if not is_transient(error) or time.monotonic() + delay_s > deadline:
                raise
            log.warning("%s met a transient error, retrying in %.1fs: %s: %s", step, delay_s,
                        type(error).__name__, _first_line(error))
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, max_delay_s)


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [""])[0][:300]
