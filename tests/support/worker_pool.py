"""A fixed number of worker slots kept filled, as a process supervisor (systemd,
Kubernetes) keeps them: a worker signalled by the soak is replaced after a delay, and
one that exits on its own is recorded (with its last log line) and replaced at once: as
an unexpected exit once it was ready, else as a failed start (a worker refuses to start
while its database or broker is down, and says so; the supervisor tries again).

    pool = WorkerPool(deployment, model="soak-bert", size=3)
    pool.start()                                   # spawns, then supervises on a thread
    pool.interrupt(signal.SIGKILL, target=5, restart_after_s=4)
    pool.close()                                   # stops supervising; stop_workers() ends them
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.stack import Stack

READY_MARK = b" ready."   # Celery's "celery@host ready." line


@dataclass
class Slot:
    process: subprocess.Popen
    spawned_at: float
    ready_at: float | None = None
    is_interrupted: bool = False   # the soak signalled it: its exit is expected


@dataclass
class Interruption:
    signal_name: str                 # SIGKILL | SIGTERM
    pid: int
    exit_code: int                   # -9 for SIGKILL; 0 for a clean drain
    signalled_at: float
    replacement: Slot | None = None  # None: the soak ended before the restart


@dataclass(frozen=True)
class UnexpectedExit:
    pid: int
    exit_code: int
    last_log_line: str


@dataclass
class WorkerPool:
    deployment: Stack
    model: str
    size: int
    sigterm_wait_s: float = 60.0    # a drain's grace and then some
    slots: list[Slot] = field(default_factory=list)
    interruptions: list[Interruption] = field(default_factory=list)
    unexpected_exits: list[UnexpectedExit] = field(default_factory=list)   # after it was ready: a crash
    failed_starts: list[UnexpectedExit] = field(default_factory=list)      # before: e.g. its database was down
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        for _ in range(self.size):
            self.slots.append(self._spawn())
        self._thread = threading.Thread(target=self._supervise, name="soak-supervisor", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(slot.ready_at for slot in self.slots):
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout_s:.0f}s:\n{self.deployment.worker_logs()}")
            time.sleep(0.2)

    def interrupt(self, signum: int, target: int, restart_after_s: float) -> bool:
        """Signal one live worker (`target` modulo the ready ones, else the live ones),
        wait for it to exit, then after `restart_after_s` start its replacement in the
        same slot. False if no worker was live to signal."""
        with self._lock:
            live = [i for i, s in enumerate(self.slots) if not s.is_interrupted and s.process.poll() is None]
            candidates = [i for i in live if self.slots[i].ready_at] or live
            if not candidates:
                return False
            index = candidates[target % len(candidates)]
            slot = self.slots[index]
            slot.is_interrupted = True
            signalled_at = time.time()
            slot.process.send_signal(signum)
        try:
            exit_code = slot.process.wait(timeout=self.sigterm_wait_s)
        except subprocess.TimeoutExpired:   # a drain that does not end: what a supervisor does next
            slot.process.kill()
            exit_code = slot.process.wait()
        record = Interruption(signal.Signals(signum).name, slot.process.pid, exit_code, signalled_at)
        self._stopped.wait(restart_after_s)
        with self._lock:
            if not self._stopped.is_set():
                self.slots[index] = record.replacement = self._spawn()
            self.interruptions.append(record)
        return True

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def downtime_s(self) -> float:
        """Seconds from each signal until its replacement was ready (a slot's lost time)."""
        lost = 0.0
        for record in self.interruptions:
            replacement = record.replacement
            end = replacement.ready_at if replacement is not None and replacement.ready_at else time.time()
            lost += end - record.signalled_at
        return lost

    def _spawn(self) -> Slot:
        return Slot(process=self.deployment.spawn_worker(self.model), spawned_at=time.time())

    def _supervise(self) -> None:
        while not self._stopped.wait(0.5):
            with self._lock:
                for index, slot in enumerate(self.slots):
                    if slot.ready_at is None and READY_MARK in Path(slot.process.log_path).read_bytes():
                        slot.ready_at = time.time()
                    exit_code = slot.process.poll()
                    if exit_code is not None and not slot.is_interrupted:
                        exits = self.unexpected_exits if slot.ready_at else self.failed_starts
                        exits.append(UnexpectedExit(slot.process.pid, exit_code, _last_line(slot.process.log_path)))
                        self.slots[index] = self._spawn()


def _last_line(log_path: Path) -> str:
    lines = Path(log_path).read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""
