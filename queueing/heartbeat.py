"""The worker's heartbeat: every few seconds, one row in barge_workers (jobs.worker_beats)
with its models and each loaded engine's settings and step figures — batch occupancy
and KV-cache use, taken by a step observer of its own — for the dashboard's workers page.

Its current shards are not reported here: the shards' own rows name the worker holding
them (worker_id, lease), and the dashboard reads them there.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from jobs.worker_beats import EngineBeat, WorkerBeat, WorkerBeats
from queueing.device_telemetry import DeviceTelemetry
from queueing.devices import DeviceSlot
from queueing.runtime import EngineKey, Runtime
from queueing.usage import engine_settings

log = logging.getLogger("barge.worker")

BEAT_S = 5.0


class StepTally:
    """One engine's steps since the last beat: a step observer (engine.step_stats)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.num_steps = 0
        self._occupancy_sum = 0.0
        self._num_since_beat = 0
        self.last = None   # the last StepStats

    def __call__(self, stats) -> None:
        with self._lock:
            self.num_steps += 1
            self._occupancy_sum += stats.occupancy
            self._num_since_beat += 1
            self.last = stats

    def take(self, settings: dict, device: dict | None = None) -> EngineBeat:
        """The figures for one beat; the occupancy mean starts afresh after it."""
        with self._lock:
            occupancy = self._occupancy_sum / self._num_since_beat if self._num_since_beat else None
            self._occupancy_sum, self._num_since_beat = 0.0, 0
            last = self.last
        return EngineBeat(settings=settings, num_steps=self.num_steps,
                          occupancy=None if occupancy is None else round(occupancy, 4),
                          kv_cache_usage=None if last is None or last.kv_cache_usage is None
                          else round(last.kv_cache_usage, 4),
                          num_seqs=None if last is None else last.num_seqs, device=device)


class Heartbeat(threading.Thread):
    def __init__(self, runtime: Runtime, interval_s: float = BEAT_S):
        super().__init__(name="barge-heartbeat", daemon=True)
        self.runtime = runtime
        self.interval_s = interval_s
        self.beats = WorkerBeats(runtime.store.engine)
        self.started_at = time.time()
        self.tallies: dict[EngineKey, StepTally] = {}   # engine key -> its engine's tally
        self.telemetry = DeviceTelemetry(getattr(runtime, "device", None) or DeviceSlot("cpu", 0))   # `barge workers`
        self.stopped = threading.Event()

    def run(self) -> None:
        while True:
            self.beat()
            if self.stopped.wait(self.interval_s):
                return

    def stop(self) -> None:
        self.stopped.set()
        self.beat(stopped_at=time.time())

    def beat(self, stopped_at: float | None = None, stall: str | None = None) -> None:
        """`stall`: the last beat of a process whose engine stalled (queueing.stall), and why."""
        try:
            engines = [replace(e, stall=stall) for e in self._engines()] if stall else self._engines()
            self.beats.beat(WorkerBeat(id=self.runtime.worker_id, models=sorted(self.runtime.models),
                                       engines=engines, started_at=self.started_at,
                                       heartbeat_at=time.time(), stopped_at=stopped_at))
        except Exception:   # a database blip: the next beat tries again
            log.warning("heartbeat failed", exc_info=True)

    def _engines(self) -> list[EngineBeat]:
        found = []
        try:
            device = self.telemetry.read().to_dict()
        except Exception:   # figures are a report: never a reason to miss a beat
            log.warning("reading device figures failed", exc_info=True)
            device = None
        for key, engine in list(self.runtime.engines.items()):
            tally = self.tallies.get(key)
            if tally is None:
                tally = self.tallies[key] = StepTally()
                engine.add_step_observer(tally)
            found.append(tally.take(engine_settings(engine, key.model_key), device))
        return found
