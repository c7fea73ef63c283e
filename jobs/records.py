"""Typed rows read from the store; what the client, tasks and CLI pass around."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from jobs.spec import JobSpec
from jobs.status import JobStatus, ShardStatus
from jobs.throughput import Throughput


@dataclass(frozen=True)
class JobRecord:
    id: str
    status: JobStatus
    spec: JobSpec
    model_key: str
    rows_total: int
    output_schema: str    # storage.manifest.encode_schema of every part's schema
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    cache_namespace: str | None = None   # incremental jobs: where their results are cached

    @classmethod
    def from_row(cls, row) -> "JobRecord":
        return cls(id=row.id, status=JobStatus(row.status), spec=JobSpec.from_dict(json.loads(row.spec)),
                   model_key=row.model_key, rows_total=row.rows_total, output_schema=row.output_schema,
                   error=row.error,
                   created_at=row.created_at, started_at=row.started_at, finished_at=row.finished_at,
                   cache_namespace=row.cache_namespace)


@dataclass(frozen=True)
class ShardRecord:
    job_id: str
    shard_index: int
    plan: dict            # storage.plan.ShardPlan fields
    num_rows: int
    status: ShardStatus
    attempt: int
    token: str | None
    part: dict | None     # storage.write.PartInfo fields, once committed
    rows_succeeded: int
    rows_failed: int
    error: str | None
    worker_id: str | None = None     # the worker that holds (or last held) the shard
    started_at: float | None = None  # the current (or last) attempt's start
    finished_at: float | None = None

    @classmethod
    def from_row(cls, row) -> "ShardRecord":
        return cls(job_id=row.job_id, shard_index=row.shard_index, plan=json.loads(row.plan),
                   num_rows=row.num_rows, status=ShardStatus(row.status), attempt=row.attempt,
                   token=row.token, part=json.loads(row.part) if row.part else None,
                   rows_succeeded=row.rows_succeeded, rows_failed=row.rows_failed, error=row.error,
                   worker_id=row.worker_id, started_at=row.started_at, finished_at=row.finished_at)


@dataclass(frozen=True)
class JobProgress:
    """A job's state as `status()` reports it. Holds no secret."""

    job_id: str
    status: JobStatus
    rows_total: int
    rows_succeeded: int                 # rows of committed shards without an error
    rows_failed: int                    # rows of committed shards with an error value
    rows_reused: int = 0                # of the succeeded rows: taken from the results cache
    shards: dict[str, int] = field(default_factory=dict)   # shard status name -> count
    error: str | None = None
    output: str = ""
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    num_tokens: int = 0                 # tokens of committed shards (jobs.throughput)
    throughput: Throughput | None = None   # rates, ETA, queued vs running time

    @property
    def rows_done(self) -> int:
        return self.rows_succeeded + self.rows_failed

    @property
    def rows_computed(self) -> int:
        """Rows the engine ran (an incremental job reuses the others from the cache)."""
        return self.rows_done - self.rows_reused

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished


@dataclass(frozen=True)
class WebhookRecord:
    """One outbox event. Holds no secret: the job's secret is read only to sign."""

    id: str                   # the webhook-id header, the same on every attempt and replay
    job_id: str
    type: str
    url: str
    body: bytes               # the exact bytes signed and sent
    status: str               # pending | delivered | failed | disabled (jobs.outbox)
    attempts: int             # attempts started over the event's life, replays included
    next_attempt_at: float
    last_status_code: int | None
    last_error: str | None
    retry_from: int = 0       # `attempts` when last replayed: attempts - retry_from is this series'
    created_at: float = 0.0
    delivered_at: float | None = None
    claimed_until: float = 0.0   # a dispatcher holds it until then


@dataclass(frozen=True)
class WebhookAttempt:
    event_id: str
    attempt: int              # 1, 2, ... over the event's life
    started_at: float
    finished_at: float | None     # None: the dispatcher died (or is still waiting) mid-attempt
    status_code: int | None       # None: no HTTP answer (timeout, refused, unsafe destination)
    latency_s: float | None
    error: str | None


@dataclass(frozen=True)
class WebhookEndpoint:
    url: str
    disabled_at: float | None     # None: enabled again by an operator
    disabled_reason: str | None   # e.g. "HTTP 410 on event msg_..."
    updated_at: float
