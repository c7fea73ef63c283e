"""`barge beat`: fires schedules. Run one or several; the database makes sure each
schedule's period gets exactly one job (jobs.schedule_store).

Each tick: for every enabled schedule, plan its due periods (catch-up policy applied,
cursor advanced, under the schedule's lock); then submit the pending runs this beat
could claim. A run whose submission failed on a database or broker blip stays pending
and is claimed again when its lease ends.

The clock is the system's, or, for tests and rehearsals, the UTC epoch written in the
file named by BARGE_CLOCK_FILE: several beat processes then share a simulated time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from jobs.schedule_client import submit_run

log = logging.getLogger("barge.beat")

DEFAULT_INTERVAL_S = 5.0


class SystemClock:
    def now(self) -> float:
        return time.time()


@dataclass(frozen=True)
class FileClock:
    """Simulated time: the float in `path`, rewritten by whoever drives the simulation."""

    path: Path

    def now(self) -> float:
        return float(self.path.read_text().strip())


def clock_from_env(env: dict[str, str] | None = None):
    env = os.environ if env is None else env
    path = env.get("BARGE_CLOCK_FILE")
    return FileClock(Path(path)) if path else SystemClock()


@dataclass(frozen=True)
class TickResult:
    runs_created: int
    periods_skipped: int
    submitted: int
    refused: int


class Beat:
    def __init__(self, client, clock=None, interval_s: float = DEFAULT_INTERVAL_S):
        self.client = client
        self.clock = clock or SystemClock()
        self.interval_s = interval_s
        self.stopped = threading.Event()

    def tick(self) -> TickResult:
        store, now = self.client.store, self.clock.now()
        created = skipped = 0
        for schedule_id in store.enabled_schedule_ids():
            runs, missed = store.plan_due_runs(schedule_id, now)
            created, skipped = created + len(runs), skipped + len(missed)
            if missed:
                log.info("schedule %s: %d missed periods skipped by its catch-up policy", schedule_id, len(missed))
        outcomes = [submit_run(self.client, run)[0] for run in store.claim_pending_runs(now)]
        return TickResult(created, skipped, outcomes.count("submitted"), outcomes.count("refused"))

    def run_forever(self) -> None:
        log.info("beat: ticking every %.1fs", self.interval_s)
        while not self.stopped.is_set():
            try:
                self.tick()
            except Exception:   # a database or broker blip must not end the beat
                log.exception("beat: tick failed")
            self.stopped.wait(self.interval_s)

    def stop(self) -> None:
        self.stopped.set()
