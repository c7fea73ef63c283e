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

An engine process that stops making progress is replaced too. Its own watchdog
(queueing.stall) ends a process whose engine is stuck in a call that releases the GIL;
one that cannot run its watchdog — stopped (SIGSTOP), or hung holding the GIL — is seen
from here: each process touches a progress file while its engine is healthy, and one
whose file has been quiet for BARGE_ENGINE_STALL_S (BARGE_ENGINE_LOAD_STALL_S before the
first touch: imports and model loading) is killed with SIGKILL and restarted as a fault.

The supervisor imports no engine and touches no GPU. SIGTERM or SIGINT is forwarded to
every engine process, each drains as a single worker does (BARGE_DRAIN_GRACE_S), and the
supervisor exits 0 once all of them did.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from queueing.devices import DeviceSlot, restart_delay
from queueing.stall import PROGRESS_FILE_ENV, stall_limits

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
    progress_file: Path | None = None                         # touched by its engine watchdog (queueing.stall)
    started_wall: float = 0.0                                 # time.time() of its last start

    def quiet_for(self, now_wall: float) -> tuple[float, bool]:
        """Seconds since its watchdog last said the engine is healthy (since its start if it
        has not yet), and whether it has said so at all."""
        try:
            return now_wall - max(self.progress_file.stat().st_mtime, self.started_wall), True
        except (OSError, AttributeError):
            return now_wall - self.started_wall, False


class Supervisor:
    def __init__(self, slots: list[DeviceSlot], argv: list[str], *, max_faults: int,
                 env: dict[str, str] | None = None, metrics_port: int = 0, stop_timeout_s: float = 120.0):
        """`argv`: the command of one engine process (`python -m cli worker --model M ...`);
        `metrics_port`: the first engine process serves metrics there, the next one port + 1, ..."""
        self.engines = [EngineProcess(slot) for slot in slots]
        self.argv = argv
        self.max_faults = max_faults
        self.env = dict(os.environ if env is None else env)
        self.metrics_port = metrics_port
        self.stop_timeout_s = stop_timeout_s
        self.is_stopping = False
        self.stall_s, self.load_stall_s = stall_limits(self.env)   # as its engine processes' watchdogs
        self.progress_dir = Path(tempfile.mkdtemp(prefix="barge-supervisor-"))

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
        engine.progress_file = self.progress_dir / f"engine-{position}.progress"
        engine.progress_file.unlink(missing_ok=True)
        env = {**self.env, **engine.slot.child_env(), PROGRESS_FILE_ENV: str(engine.progress_file)}
        argv = list(self.argv)
        if self.metrics_port:
            argv += ["--metrics-port", str(self.metrics_port + position)]
        engine.process = subprocess.Popen(argv, env=env)
        engine.started_wall = time.time()
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
                status = self._kill_if_quiet(engine)
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

    def _kill_if_quiet(self, engine: EngineProcess) -> int | None:
        """SIGKILL an engine process whose watchdog has been quiet too long; its exit status then."""
        quiet_s, has_spoken = engine.quiet_for(time.time())
        limit_s = self.stall_s if has_spoken else self.load_stall_s
        if quiet_s <= limit_s:
            return None
        log.error("engine process %s (pid %d) made no progress for %.0f s (limit %.0f s): stopped, or hung where "
                  "its own watchdog cannot run; killing it (its shards come back through their leases)",
                  engine.slot.label, engine.process.pid, quiet_s, limit_s)
        engine.process.kill()   # SIGKILL ends a stopped process too
        return engine.process.wait()

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
        shutil.rmtree(self.progress_dir, ignore_errors=True)
        log.info("supervisor stopped: %d engine processes drained; exit status %d", len(statuses), status)
        return status


def run_worker(models: list[str], *, worker_command: Sequence[str], devices: str | None = None,
               loglevel: str = "INFO", metrics_port: int | None = None) -> int:
    """`barge worker`: serve in this process when it is one slot's engine process (or the
    CPU alone), else supervise one engine process per slot. `worker_command`: how an engine
    process runs `barge worker` again (cli.worker's `python -m cli worker`), its options after it."""
    from jobs.hosts import check_setting
    from jobs.settings import Settings
    from jobs.store import Store
    from queueing.devices import SLOT_VARIABLE, count_visible_gpus, max_faults_from_env, parse_devices
    from jobs.logs import configure_logging
    from queueing.runtime import WorkerOptions

    settings = Settings.from_env()
    # many hosts: the results cache every worker writes and reads must be shared (jobs.hosts)
    check_setting("BARGE_CACHE_URL", settings.cache_url, settings)
    if os.environ.get(SLOT_VARIABLE):
        return _serve_refusing_misfits(models, loglevel, metrics_port, DeviceSlot.from_label(os.environ[SLOT_VARIABLE]))
    slots = parse_devices(devices if devices is not None else os.environ.get("BARGE_DEVICES"), count_visible_gpus())
    if slots == [DeviceSlot("cpu", 0)]:
        return _serve_refusing_misfits(models, loglevel, metrics_port, slots[0])
    configure_logging(loglevel)
    Store(settings.database_url).migrate()   # once, not raced by every engine process
    options = WorkerOptions.from_env()
    argv = [*worker_command, "--loglevel", loglevel, "--metrics-port", "0"]
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
