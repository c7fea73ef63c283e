"""Job and shard states, and the only transitions allowed between them.

Both enums are ordered: every member from the first final state on is finished, so
`status.is_finished` is a comparison, never a list to keep in sync.
"""

from __future__ import annotations

import enum


class InvalidTransition(ValueError):
    """A state change that the state machine does not allow."""


class JobStatus(enum.IntEnum):
    QUEUED = 0       # accepted and validated; the plan task is on the queue
    RUNNING = 1      # shards planned; workers are running them
    FINALIZING = 2   # every shard is finished; manifest and _SUCCESS are being written
    SUCCEEDED = 3    # output committed (_SUCCESS written); final
    FAILED = 4       # a shard failed for good, or planning/finalizing failed; final
    CANCELLED = 5    # cancelled by the user; final
    EXPIRED = 6      # not finished within spec.expires_after_s of submission; final

    @property
    def is_finished(self) -> bool:
        return self >= JobStatus.SUCCEEDED

    def __str__(self) -> str:
        return self.name.lower()


class ShardStatus(enum.IntEnum):
    PENDING = 0      # planned, waiting for a worker (or released for another attempt)
    RUNNING = 1      # a worker holds it under an attempt token
    COMMITTED = 2    # its part file is written and recorded under the current token; final
    FAILED = 3       # failed on every allowed attempt; final
    CANCELLED = 4    # its job was cancelled before it committed; final

    @property
    def is_finished(self) -> bool:
        return self >= ShardStatus.COMMITTED

    def __str__(self) -> str:
        return self.name.lower()


JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED}),
    JobStatus.RUNNING: frozenset({JobStatus.FINALIZING, JobStatus.FAILED, JobStatus.CANCELLED,
                                  JobStatus.EXPIRED}),
    JobStatus.FINALIZING: frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED}),
    JobStatus.SUCCEEDED: frozenset(),
    # Final, except that `Client.retry` re-runs what a failed, cancelled or expired job
    # left undone: back to RUNNING with its unfinished shards, or to QUEUED if it never
    # got as far as planning.
    JobStatus.FAILED: frozenset({JobStatus.RUNNING, JobStatus.QUEUED}),
    JobStatus.CANCELLED: frozenset({JobStatus.RUNNING, JobStatus.QUEUED}),
    JobStatus.EXPIRED: frozenset({JobStatus.RUNNING, JobStatus.QUEUED}),
}

SHARD_TRANSITIONS: dict[ShardStatus, frozenset[ShardStatus]] = {
    ShardStatus.PENDING: frozenset({ShardStatus.RUNNING, ShardStatus.CANCELLED}),
    # RUNNING -> RUNNING: a redelivered message takes the shard over under a new token.
    ShardStatus.RUNNING: frozenset({ShardStatus.RUNNING, ShardStatus.PENDING, ShardStatus.COMMITTED,
                                    ShardStatus.FAILED, ShardStatus.CANCELLED}),
    ShardStatus.COMMITTED: frozenset(),
    # A retried job runs its failed and cancelled shards again (committed ones stay).
    ShardStatus.FAILED: frozenset({ShardStatus.PENDING}),
    ShardStatus.CANCELLED: frozenset({ShardStatus.PENDING}),
}


def can_transition(current: JobStatus | ShardStatus, target: JobStatus | ShardStatus) -> bool:
    table = JOB_TRANSITIONS if isinstance(current, JobStatus) else SHARD_TRANSITIONS
    return target in table[current]


def check_transition(current: JobStatus | ShardStatus, target: JobStatus | ShardStatus) -> None:
    if not can_transition(current, target):
        kind = "job" if isinstance(current, JobStatus) else "shard"
        raise InvalidTransition(f"{kind} cannot go from {current} to {target}")
