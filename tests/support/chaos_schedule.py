"""The chaos soak's fault schedule: which fault, when, for how long, drawn from a seed.

A pure function of (seed, profile), so a run can be repeated and a failing seed kept:

    schedule = plan_faults(seed=7, profile=SHORT)
    for fault in schedule: print(f"{fault.at_s:6.1f}s {fault.kind.value} for {fault.duration_s:.0f}s")

Faults of one kind never overlap (a service is not stopped twice at once); faults of
different kinds may, as they do in production.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class FaultKind(enum.Enum):
    WORKER_SIGKILL = "worker-sigkill"        # kill -9 a worker; a fresh one starts duration_s later
    WORKER_SIGTERM = "worker-sigterm"        # a drain; a fresh one starts once it exits, after duration_s
    BROKER_RESTART = "broker-restart"        # RabbitMQ stop_app / start_app, or Redis shut down and started
    POSTGRES_RESTART = "postgres-restart"    # the PostgreSQL cluster stopped (fast) and started
    S3_SLOWDOWN_BURST = "s3-503-burst"       # the next `size` S3 requests answered 503 SlowDown
    S3_DROPPED_CONNECTIONS = "s3-drop"       # the next `size` S3 requests' connections closed unanswered
    RECEIVER_DOWN = "receiver-down"          # the webhook receiver not listening
    RECEIVER_ERRORS = "receiver-500"         # the receiver answering 500
    RECEIVER_HANGS = "receiver-hang"         # the receiver holding its answers past the sender's timeout


@dataclass(frozen=True)
class ScheduledFault:
    at_s: float          # seconds after the jobs were submitted
    kind: FaultKind
    duration_s: float    # outage length (services, receiver) or delay before the restart (workers)
    size: int = 0        # S3 faults: how many requests are faulted
    target: int = 0      # worker faults: which worker slot (modulo the slots alive then)


@dataclass(frozen=True)
class FaultProfile:
    """How many faults of each kind, over which window, and how long each lasts."""

    window_s: tuple[float, float]                 # faults start within [first, last] seconds
    counts: dict[FaultKind, int]                  # kind -> number of faults
    durations_s: dict[FaultKind, tuple[float, float]]   # kind -> (shortest, longest)
    s3_burst_sizes: tuple[int, int] = (10, 40)    # requests per S3 burst


FULL = FaultProfile(
    window_s=(30.0, 630.0),
    counts={FaultKind.WORKER_SIGKILL: 8, FaultKind.WORKER_SIGTERM: 4, FaultKind.BROKER_RESTART: 2,
            FaultKind.POSTGRES_RESTART: 2, FaultKind.S3_SLOWDOWN_BURST: 6, FaultKind.S3_DROPPED_CONNECTIONS: 6,
            FaultKind.RECEIVER_DOWN: 2, FaultKind.RECEIVER_ERRORS: 3, FaultKind.RECEIVER_HANGS: 2},
    durations_s={FaultKind.WORKER_SIGKILL: (2, 20), FaultKind.WORKER_SIGTERM: (2, 10),
                 FaultKind.BROKER_RESTART: (5, 30), FaultKind.POSTGRES_RESTART: (3, 20),
                 FaultKind.RECEIVER_DOWN: (120, 240), FaultKind.RECEIVER_ERRORS: (20, 60),
                 FaultKind.RECEIVER_HANGS: (20, 60)},
)

# The test suite's: every kind at least once, packed into the first minute and a half.
SHORT = FaultProfile(
    window_s=(5.0, 80.0),
    counts={FaultKind.WORKER_SIGKILL: 2, FaultKind.WORKER_SIGTERM: 1, FaultKind.BROKER_RESTART: 1,
            FaultKind.POSTGRES_RESTART: 1, FaultKind.S3_SLOWDOWN_BURST: 2, FaultKind.S3_DROPPED_CONNECTIONS: 2,
            FaultKind.RECEIVER_DOWN: 1, FaultKind.RECEIVER_ERRORS: 1, FaultKind.RECEIVER_HANGS: 1},
    durations_s={FaultKind.WORKER_SIGKILL: (1, 4), FaultKind.WORKER_SIGTERM: (1, 3),
                 FaultKind.BROKER_RESTART: (3, 6), FaultKind.POSTGRES_RESTART: (3, 6),
                 FaultKind.RECEIVER_DOWN: (20, 30), FaultKind.RECEIVER_ERRORS: (8, 12),
                 FaultKind.RECEIVER_HANGS: (8, 12)},
    s3_burst_sizes=(5, 20),
)


def plan_faults(seed: int, profile: FaultProfile) -> list[ScheduledFault]:
    """The profile's faults at seeded times, in time order; a kind's faults never overlap."""
    rng = random.Random(seed)
    faults = []
    for kind in FaultKind:   # a fixed order: the same seed draws the same numbers
        faults += _faults_of(kind, profile, rng)
    return sorted(faults, key=lambda fault: (fault.at_s, fault.kind.value))


def _faults_of(kind: FaultKind, profile: FaultProfile, rng: random.Random) -> list[ScheduledFault]:
    count = profile.counts.get(kind, 0)
    if count == 0:
        return []
    first, last = profile.window_s
    shortest, longest = profile.durations_s.get(kind, (0.0, 0.0))
    # One fault per equal slice of the window, at a random point of its slice: spread out,
    # and a slice is longer than the longest outage whenever the window allows.
    slice_s = (last - first) / count
    faults = []
    for index in range(count):
        duration_s = round(rng.uniform(shortest, longest), 1)
        latest_start = max(0.0, slice_s - duration_s)
        at_s = round(first + index * slice_s + rng.uniform(0.0, latest_start), 1)
        size = rng.randint(*profile.s3_burst_sizes) if kind.value.startswith("s3") else 0
        faults.append(ScheduledFault(at_s=at_s, kind=kind, duration_s=duration_s, size=size,
                                     target=rng.randrange(1 << 16)))
    return faults
