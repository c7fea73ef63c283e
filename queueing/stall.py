"""A shard is held on progress, not on liveness: the engine watchdog.

A shard's lease is renewed by a background thread (queueing.lease) for as long as the
process lives. An engine stuck in a call that releases the GIL — a CUDA synchronisation
that never returns, a read from a stalled network mount — leaves that thread renewing, so
the shard was never re-run and the job never ended. Now every engine call runs inside
`EngineWatch.busy`, every engine step (a generate scheduler step, an embed forward batch,
a Whisper decoder step: engine.step_stats) counts as progress, and a watchdog thread
checks each busy thread: no step for `stall_s` (`load_stall_s` while a model loads or an
engine has not made its first step yet: loading weights, compiling kernels) and the
process logs why and exits with EXIT_ENGINE_STALLED. Its leases lapse; another worker's
housekeeper sends the shard again; the supervisor (`--devices`) or the service manager
starts a fresh process.

A process that cannot run its own watchdog — stopped (SIGSTOP), or hung holding the GIL —
is caught from outside: the watchdog touches `progress_file` on every tick while nothing
has stalled, and the supervisor kills and restarts an engine process whose file has gone
quiet for `stall_s` (queueing.supervisor).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger("barge.worker")

EXIT_ENGINE_STALLED = 75      # EX_TEMPFAIL: a fresh process may well do it
STALL_S = 300.0               # no engine step for this long: stalled. A CPU embed batch of 64k tokens
                              # takes seconds; a generate step milliseconds; Whisper's longest step a second
LOAD_STALL_S = 1800.0         # while loading a model or before an engine's first step (kernels compile)
PROGRESS_FILE_ENV = "BARGE_ENGINE_PROGRESS_FILE"


@dataclass
class _Busy:
    what: str
    since: float          # monotonic: entered
    last_step: float      # monotonic: the last step of this thread's engine call (or `since`)
    limit_s: float


class EngineWatch:
    def __init__(self, stall_s: float = STALL_S, load_stall_s: float = LOAD_STALL_S, *,
                 on_stall: Callable[[str], None] | None = None, progress_file: str | os.PathLike | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stall_s = stall_s
        self.load_stall_s = max(load_stall_s, stall_s)
        self.on_stall = on_stall or stall_exit
        self.progress_file = Path(progress_file) if progress_file else None
        self.clock = clock
        self._busy: dict[int, list[_Busy]] = {}   # thread id -> its nested engine calls
        self._stepped: set[int] = set()           # id() of engines that have made a step
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, engine) -> None:
        """Count `engine`'s steps as progress (a step observer: engine.step_stats)."""
        engine.add_step_observer(lambda _stats, key=id(engine): self.step(key))

    def step(self, engine_key: int | None = None) -> None:
        """Progress on the calling thread (called on the engine's thread, between steps)."""
        now = self.clock()
        with self._lock:
            if engine_key is not None:
                self._stepped.add(engine_key)
            for busy in self._busy.get(threading.get_ident(), ()):
                busy.last_step = now

    @contextmanager
    def busy(self, what: str, engine=None, *, loading: bool = False) -> Iterator[None]:
        """An engine call (or a model load) on this thread: watched until it returns."""
        now, ident = self.clock(), threading.get_ident()
        with self._lock:
            first = loading or (engine is not None and id(engine) not in self._stepped)
            entry = _Busy(what, now, now, self.load_stall_s if first else self.stall_s)
            self._busy.setdefault(ident, []).append(entry)
        try:
            yield
        finally:
            with self._lock:
                stack = self._busy.get(ident, [])
                if entry in stack:
                    stack.remove(entry)
                if not stack:
                    self._busy.pop(ident, None)

    def stalled(self, now: float | None = None) -> str | None:
        """Why the engine counts as stalled now, or None."""
        now = self.clock() if now is None else now
        with self._lock:
            for stack in self._busy.values():
                for busy in stack:
                    quiet = now - max(busy.since, busy.last_step)
                    if quiet > busy.limit_s:
                        return (f"no engine step for {quiet:.0f} s (limit {busy.limit_s:.0f} s) in {busy.what}, "
                                f"busy for {now - busy.since:.0f} s")
        return None

    # -- the watchdog thread ---------------------------------------------------------------

    def start(self) -> EngineWatch:
        self._thread = threading.Thread(target=self._run, name="barge-engine-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    @property
    def tick_s(self) -> float:
        return min(1.0, self.stall_s / 4)

    def _run(self) -> None:
        while not self._stopped.wait(self.tick_s):
            reason = self.stalled()
            if reason is not None:
                self.on_stall(reason)
                return
            self._touch()

    def _touch(self) -> None:
        if self.progress_file is None:
            return
        try:
            self.progress_file.touch()
        except OSError:   # the supervisor's folder went away: it is stopping
            pass


def stall_exit(reason: str) -> None:
    """The default on_stall: say why, then exit at once. The stuck call cannot be
    interrupted, and a clean shutdown would wait for it."""
    log.critical("engine stalled: %s; this process exits (status %d) for a fresh one; its shards come back "
                 "through their leases", reason, EXIT_ENGINE_STALLED)
    logging.shutdown()
    os._exit(EXIT_ENGINE_STALLED)


def stall_limits(env: dict[str, str] | None = None) -> tuple[float, float]:
    """(stall_s, load_stall_s) from BARGE_ENGINE_STALL_S and BARGE_ENGINE_LOAD_STALL_S: the
    engine process's watchdog and its supervisor read the same two limits."""
    env = os.environ if env is None else env
    stall_s = float(env.get("BARGE_ENGINE_STALL_S") or STALL_S)
    return stall_s, max(float(env.get("BARGE_ENGINE_LOAD_STALL_S") or LOAD_STALL_S), stall_s)


def watch_from_env(on_stall: Callable[[str], None] | None = None, env: dict[str, str] | None = None) -> EngineWatch:
    """The limits (stall_limits) and the supervisor's progress file."""
    env = os.environ if env is None else env
    return EngineWatch(*stall_limits(env), on_stall=on_stall, progress_file=env.get(PROGRESS_FILE_ENV) or None)
