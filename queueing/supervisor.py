"""The device supervisor: `barge worker --devices ...` with several slots (or on a GPU
machine) starts one engine process per slot and keeps them running.

Each engine process is a whole Barge worker (`barge worker` run again, with
BARGE_DEVICE_SLOT and CUDA_VISIBLE_DEVICES set: queueing.devices.DeviceSlot.child_env),
pinned to its device, with its own Celery hostname, heartbeat and leases. So nothing
new stands between the broker and an engine: a process that dies takes its shards with
it exactly as a crashed single worker does, and they come back through the leases
(jobs.shard_store) on the next housekeeping pass of any live process.

    supervisor ─┬─ engine process cuda:0 ── Celery solo pool, engine on cuda:0
                ├─ engine process cuda:1
                └─ engine process cuda:3   (fell: restarted after 1 s, 2 s, 4 s ...;
                                            after BARGE_DEVICE_MAX_FAULTS within the hour
                                            left down: one bad GPU costs one GPU)

The supervisor imports no engine and touches no GPU. SIGTERM or SIGINT is forwarded to
every engine process, each drains as a single worker does (BARGE_DRAIN_GRACE_S), and the
supervisor exits 0 once all of them did.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from queueing.devices import DeviceSlot, restart_delay

log = logging.getLogger("barge.supervisor")

POLL_S = 0.2
EXIT_DOES_NOT_FIT = 78   # EX_CONFIG: the model does not fit its device share; restarting cannot help


@dataclass
class EngineProcess:
    """One slot's engine process and its history."""

    slot: DeviceSlot
    process: subprocess.Popen | None = None
    fault_times: list[float] = field(default_factory=list)   # monotonic times it fell
    restart_at: float | None = None                           # monotonic: start again then
    is_unhealthy: bool = False
    num_starts: int = 0


class Supervisor:
    def __init__(self, slots: list[DeviceSlot], argv: list[str], *, max_faults: int,
                 env: dict[str, str] | None = None, metrics_port: int = 0, stop_timeout_s: float = 120.0):
        """`argv`: the command of one engine process (`python -m jobs.cli worker --model M ...`);
        `metrics_port`: the first engine process serves metrics there, the next one port + 1, ..."""
        self.engines = [EngineProcess(slot) for slot in slots]
        self.argv = argv
        self.max_faults = max_faults
        self.env = dict(os.environ if env is None else env)
        self.metrics_port = metrics_port
        self.stop_timeout_s = stop_timeout_s
        self.is_stopping = False

    def run(self) -> int:
        """Until stopped (0 when every engine process drained cleanly) or until every
        device is unhealthy (1)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        log.info("supervising %d engine processes: %s", len(self.engines),
                 ", ".join(engine.slot.label for engine in self.engines))
        for engine in self.engines:
            self._start(engine)
        while not self.is_stopping:
            self._check(time.monotonic())
            if all(engine.is_unhealthy for engine in self.engines):
                log.error("every device is unhealthy; the supervisor stops")
                return 1
            time.sleep(POLL_S)
        return self._stop()

    def _on_signal(self, signum, _frame) -> None:
        if not self.is_stopping:
            log.info("%s: draining every engine process", signal.Signals(signum).name)
        self.is_stopping = True

    def _start(self, engine: EngineProcess) -> None:
        position = self.engines.index(engine)
        env = {**self.env, **engine.slot.child_env()}
        argv = list(self.argv)
        if self.metrics_port:
            argv += ["--metrics-port", str(self.metrics_port + position)]
        engine.process = subprocess.Popen(argv, env=env)
        engine.restart_at = None
        engine.num_starts += 1
        log.info("engine process %s started (pid %d, start %d)", engine.slot.label, engine.process.pid,
                 engine.num_starts)

    def _check(self, now: float) -> None:
        for engine in self.engines:
            if engine.is_unhealthy:
                continue
            if engine.process is None:
                if engine.restart_at is not None and now >= engine.restart_at:
                    self._start(engine)
                continue
            status = engine.process.poll()
            if status is None:
                continue
            engine.process = None
            if status == EXIT_DOES_NOT_FIT:
                engine.is_unhealthy = True
                log.error("engine process %s refused its model (it does not fit the device; see its log); the "
                          "device is left down", engine.slot.label)
                continue
            engine.fault_times.append(now)
            delay = restart_delay(engine.fault_times, now, self.max_faults)
            if delay is None:
                engine.is_unhealthy = True
                log.error("engine process %s exited with status %s; %d faults within the hour: device %s is "
                          "marked unhealthy and left down (BARGE_DEVICE_MAX_FAULTS=%d)", engine.slot.label, status,
                          len(engine.fault_times), engine.slot.label, self.max_faults)
                continue
            engine.restart_at = now + delay
            log.warning("engine process %s exited with status %s; restarting it in %.0f s (its shards come back "
                        "through their leases)", engine.slot.label, status, delay)

    def _stop(self) -> int:
        running = [engine.process for engine in self.engines if engine.process is not None]
        for process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        statuses = []
        for process in running:
            try:
                statuses.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                log.error("engine process %d did not drain in %.0f s; killing it", process.pid, self.stop_timeout_s)
                process.kill()
                statuses.append(process.wait())
        status = 0 if all(s == 0 for s in statuses) else 1
        log.info("supervisor stopped: %d engine processes drained; exit status %d", len(statuses), status)
        return status


def run_worker(models: list[str], *, devices: str | None = None, loglevel: str = "INFO",
               metrics_port: int | None = None) -> int:
    """`barge worker`: serve in this process when it is one slot's engine process (or the
    CPU alone), else supervise one engine process per slot."""
    import sys

    from jobs.settings import Settings
    from jobs.store import Store
    from queueing.devices import SLOT_VARIABLE, count_visible_gpus, max_faults_from_env, parse_devices
    from queueing.logs import configure_logging
    from queueing.runtime import WorkerOptions

    if os.environ.get(SLOT_VARIABLE):
        return _serve_refusing_misfits(models, loglevel, metrics_port, DeviceSlot.from_label(os.environ[SLOT_VARIABLE]))
    slots = parse_devices(devices if devices is not None else os.environ.get("BARGE_DEVICES"), count_visible_gpus())
    if slots == [DeviceSlot("cpu", 0)]:
        return _serve_refusing_misfits(models, loglevel, metrics_port, slots[0])
    configure_logging(loglevel)
    Store(Settings.from_env().database_url).migrate()   # once, not raced by every engine process
    options = WorkerOptions.from_env()
    argv = [sys.executable, "-m", "jobs.cli", "worker", "--loglevel", loglevel, "--metrics-port", "0"]
    for model in models:
        argv += ["--model", model]
    port = options.metrics_port if metrics_port is None else metrics_port
    supervisor = Supervisor(slots, argv, max_faults=max_faults_from_env(), metrics_port=port,
                            stop_timeout_s=options.drain_grace_s + 60)
    return supervisor.run()


def _serve_refusing_misfits(models: list[str], loglevel: str, metrics_port: int | None, device: DeviceSlot) -> int:
    """serve(); a model that does not fit its share of the device ends the process with
    EXIT_DOES_NOT_FIT and the sizes on its last log line."""
    from engine.gpu_memory import ModelDoesNotFit
    from queueing.serve import serve
    try:
        return serve(models, loglevel=loglevel, metrics_port=metrics_port, device=device)
    except ModelDoesNotFit as exc:
        log.error("worker refused at start on %s: %s", device.label, exc)
        return EXIT_DOES_NOT_FIT
