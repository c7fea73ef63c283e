"""Plays a fault schedule (tests.support.chaos_schedule) against a running deployment.

Each fault runs on its own thread from its scheduled time: begin, wait its duration,
end. `stop()` cancels the faults not yet begun and ends the ones under way at once, so
whatever was stopped (a service, the receiver) is running again when it returns; it is
also what a `finally` calls.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass

from tests.support import services
from tests.support.chaos_schedule import FaultKind, ScheduledFault
from tests.support.faulty_proxy import Fault, FaultRule, FaultyProxy
from tests.support.flaky_receiver import FlakyReceiver, Mode
from tests.support.worker_pool import WorkerPool


@dataclass(frozen=True)
class InjectedFault:
    fault: ScheduledFault
    began_at: float      # epoch seconds
    lasted_s: float      # how long the outage really was (a service's start included)


class FaultInjector:
    def __init__(self, schedule: list[ScheduledFault], *, broker: str, pool: WorkerPool, proxy: FaultyProxy,
                 receiver: FlakyReceiver, log=print) -> None:
        self.schedule = schedule
        self.broker = broker            # "rabbitmq" | "redis": the service a broker restart stops
        self.pool, self.proxy, self.receiver = pool, proxy, receiver
        self.log = log
        self.injected: list[InjectedFault] = []
        self.errors: list[str] = []     # a fault that could not be applied, and why
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started_at = 0.0

    def start(self) -> None:
        self._started_at = time.monotonic()
        for fault in self.schedule:
            thread = threading.Thread(target=self._play, args=(fault,), name=f"fault-{fault.kind.value}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Cancel what has not begun, end what is under way; every service is up after."""
        self._stopped.set()
        for thread in self._threads:
            thread.join(timeout=180)
        self.receiver.come_up()
        self.receiver.set_mode(Mode.OK)
        services.ensure_up(("postgres", self.broker))

    def is_done(self) -> bool:
        """Every scheduled fault has been played and ended."""
        return all(not thread.is_alive() for thread in self._threads)

    def num_scheduled(self) -> int:
        return len(self.schedule)

    def _play(self, fault: ScheduledFault) -> None:
        if self._stopped.wait(max(0.0, self._started_at + fault.at_s - time.monotonic())):
            return
        began_at, began = time.time(), time.monotonic()
        self.log(f"[{fault.at_s:7.1f}s] {fault.kind.value}"
                 + (f" for {fault.duration_s:.0f}s" if fault.duration_s else "")
                 + (f" x{fault.size}" if fault.size else ""))
        try:
            if not self._apply(fault):
                return
        except Exception as error:   # recorded, and the soak fails on it: a fault that did not happen
            with self._lock:
                self.errors.append(f"{fault.kind.value} at {fault.at_s}s: {error!r}")
            return
        with self._lock:
            self.injected.append(InjectedFault(fault, began_at, time.monotonic() - began))

    def _apply(self, fault: ScheduledFault) -> bool:
        kind = fault.kind
        if kind in (FaultKind.WORKER_SIGKILL, FaultKind.WORKER_SIGTERM):
            signum = signal.SIGKILL if kind is FaultKind.WORKER_SIGKILL else signal.SIGTERM
            return self.pool.interrupt(signum, fault.target, fault.duration_s)
        if kind is FaultKind.BROKER_RESTART:
            self._outage(fault, lambda: services.stop(self.broker), lambda: services.start(self.broker))
        elif kind is FaultKind.POSTGRES_RESTART:
            self._outage(fault, lambda: services.stop("postgres"), lambda: services.start("postgres"))
        elif kind is FaultKind.S3_SLOWDOWN_BURST:
            self.proxy.add(FaultRule(Fault.SLOWDOWN, times=fault.size))
        elif kind is FaultKind.S3_DROPPED_CONNECTIONS:
            self.proxy.add(FaultRule(Fault.DROP, times=fault.size))
        elif kind is FaultKind.RECEIVER_DOWN:
            self._outage(fault, self.receiver.go_down, self.receiver.come_up)
        elif kind is FaultKind.RECEIVER_ERRORS:
            self._outage(fault, lambda: self.receiver.set_mode(Mode.ERRORS), lambda: self.receiver.set_mode(Mode.OK))
        elif kind is FaultKind.RECEIVER_HANGS:
            self._outage(fault, lambda: self.receiver.set_mode(Mode.HANGS), lambda: self.receiver.set_mode(Mode.OK))
        return True

    def _outage(self, fault: ScheduledFault, begin, end) -> None:
        begin()
        try:
            self._stopped.wait(fault.duration_s)
        finally:
            end()
