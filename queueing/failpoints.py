"""Failure injection for crash-safety tests, off unless BARGE_FAILPOINTS is set.

`BARGE_FAILPOINTS="crash_on_input=POISON"` makes the worker process die at once
(as from SIGKILL or an OOM kill) when a shard holding that exact input reaches the
engine: the way a poisoned row takes a real worker down, repeatably."""

from __future__ import annotations

import os


def _failpoints() -> dict[str, str]:
    spec = os.environ.get("BARGE_FAILPOINTS", "")
    return dict(item.split("=", 1) for item in spec.split(",") if "=" in item)


def crash_if_poisoned(inputs: list) -> None:
    poison = _failpoints().get("crash_on_input")
    if poison is not None and poison in inputs:
        os._exit(137)
