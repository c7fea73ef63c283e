"""Failure injection for crash-safety tests, off unless BARGE_FAILPOINTS is set.

    BARGE_FAILPOINTS="after_begin_finalize=kill,crash_on_input=POISON"

`crash_on_input=VALUE` makes the worker process die at once (as from SIGKILL or an OOM
kill) when a shard holding that exact input reaches the engine: the way a poisoned row
takes a real worker down, repeatably. `hang_on_input=VALUE` blocks the engine thread for
ever, in a wait that releases the GIL (as a CUDA synchronisation that never returns, or a
read from a stalled mount), when rows holding that input reach the engine: the lease
thread goes on renewing, which only the engine watchdog (queueing.stall) notices.

The named points of a job's lifecycle (POINTS) take an action:

- `kill`: the process dies there, `os._exit(137)`, as from SIGKILL;
- `db_error:SECONDS`: from the first pass on, for SECONDS, every pass raises the
  database driver's own OperationalError (wrapped by SQLAlchemy, as the store raises it):
  the database unreachable, seen from that line;
- `pause:PATH`: the first pass creates PATH and waits (up to 10 minutes) until it is
  removed, so that a test can do something real at that instant, such as stopping the
  database server, and let the process go on into it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

POINTS = (
    "after_submit_record",              # Client.submit: the job is recorded, its plan task not yet sent
    "before_plan_commit",               # plan_job: shards planned, not yet recorded
    "after_shard_commit_before_send",   # a shard committed; finalize or the next shards not yet sent
    "after_begin_finalize",             # the job is FINALIZING; nothing of its output written yet
    "after_manifest_before_success",    # _manifest.json written, _SUCCESS not
    "after_final_status_before_event",  # final state and event recorded; the first delivery not tried
)
# Points outside a job's lifecycle (tests/e2e/test_crash_points.py sweeps POINTS, a job each).
OTHER_POINTS = (
    "after_batch_record",               # BatchService.create: the batch is recorded, its job not yet made
)
PAUSE_LIMIT_S = 600.0

_first_pass: dict[str, float] = {}   # point -> monotonic time it was first passed (db_error's window)


def _failpoints() -> dict[str, str]:
    spec = os.environ.get("BARGE_FAILPOINTS", "")
    return dict(item.split("=", 1) for item in spec.split(",") if "=" in item)


def crash_if_poisoned(inputs: list) -> None:
    if _poisoned("crash_on_input", inputs):
        os._exit(137)


def hang_if_poisoned(inputs: list) -> None:
    if _poisoned("hang_on_input", inputs):
        threading.Event().wait()   # never set: the thread waits for ever, without the GIL


def _poisoned(name: str, inputs: list) -> bool:
    poison = _failpoints().get(name) if inputs else None
    return poison is not None and poison in inputs


def failpoint(name: str) -> None:
    """Pass the named point: nothing unless BARGE_FAILPOINTS gives it an action."""
    if name not in POINTS and name not in OTHER_POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(POINTS + OTHER_POINTS)}")
    action = _failpoints().get(name)
    if action is None:
        return
    kind, _, argument = action.partition(":")
    if kind == "kill":
        os._exit(137)
    elif kind == "db_error":
        first = _first_pass.setdefault(name, time.monotonic())
        if time.monotonic() - first < float(argument):
            raise database_unreachable(name)
    elif kind == "pause":
        _pause(Path(argument))
    else:
        raise ValueError(f"BARGE_FAILPOINTS: {name}={action!r}; actions are kill, db_error:SECONDS, pause:PATH")


def database_unreachable(name: str) -> Exception:
    """The OperationalError the store would raise with its database gone: psycopg's on
    PostgreSQL, sqlite3's otherwise, wrapped by SQLAlchemy."""
    from sqlalchemy.exc import OperationalError
    message = f"failpoint {name}: the database is unreachable"
    if os.environ.get("BARGE_DATABASE_URL", "").startswith("postgresql"):
        import psycopg
        driver_error: Exception = psycopg.OperationalError(message)
    else:
        driver_error = sqlite3.OperationalError(f"unable to open database file ({message})")
    return OperationalError("-- failpoint", None, driver_error)


def _pause(flag: Path) -> None:
    if flag.with_suffix(".passed").exists():   # paused once already (a re-driven task passes again)
        return
    flag.touch()
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    flag.with_suffix(".passed").touch()
