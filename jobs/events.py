"""The webhook events of a job: its final one (written to the outbox in the same
transaction as the final state) and the opt-in ones written with each shard commit."""

from __future__ import annotations

import time

from jobs.records import JobRecord
from jobs.status import JobStatus
from jobs.outbox import OutboxEvent
from jobs.store import ShardCommitted, ShardEvents, Store
from webhooks.events import WebhookEvent, job_event, progress_event, shard_event

STATUS_EVENTS = {JobStatus.SUCCEEDED: "job.succeeded", JobStatus.FAILED: "job.failed",
                 JobStatus.CANCELLED: "job.cancelled", JobStatus.EXPIRED: "job.expired"}
NUM_PROGRESS_STEPS = 10   # job.progress at most this often per job, however many shards


def final_event(store: Store, job_id: str, status: JobStatus, error: str | None) -> OutboxEvent | None:
    job = store.get_job(job_id)
    if not job.spec.webhook_url:
        return None
    progress = store.progress(job_id)
    now = time.time()
    output = job.spec.output if status == JobStatus.SUCCEEDED else None
    event = job_event(
        STATUS_EVENTS[status], job_id=job_id, status=str(status), rows_total=job.rows_total,
        rows_succeeded=progress.rows_succeeded, rows_failed=progress.rows_failed, output=output,
        manifest_url=f"{output.rstrip('/')}/_manifest.json" if output else None, error=error,
        metadata=job.spec.metadata,
        timings={"created_at": job.created_at, "started_at": job.started_at, "finished_at": now,
                 "queued_s": round((job.started_at or now) - job.created_at, 3),
                 "running_s": round(now - job.started_at, 3) if job.started_at else 0.0})
    return _outbox_event(event, job.spec.webhook_url)


def shard_events(job: JobRecord) -> ShardEvents | None:
    """What to write to the outbox with each shard commit of `job`; None if it opted
    into nothing (then a commit costs no extra query)."""
    wanted = set(job.spec.webhook_events)
    url = job.spec.webhook_url
    if not url or not wanted:
        return None

    def build(commit: ShardCommitted) -> list[OutboxEvent]:
        events = []
        if "shard.completed" in wanted:
            events.append(shard_event(job_id=job.id, shard_index=commit.shard_index,
                                      rows_succeeded=commit.rows_succeeded, rows_failed=commit.rows_failed,
                                      part=commit.part_name, metadata=job.spec.metadata))
        if "job.progress" in wanted and is_progress_step(commit.shards_finished, commit.shards_total):
            events.append(progress_event(job_id=job.id, rows_total=job.rows_total,
                                         rows_succeeded=commit.job_rows_succeeded,
                                         rows_failed=commit.job_rows_failed, shards_total=commit.shards_total,
                                         shards_finished=commit.shards_finished, metadata=job.spec.metadata))
        return [_outbox_event(event, url) for event in events]

    return build


def is_progress_step(shards_finished: int, shards_total: int, num_steps: int = NUM_PROGRESS_STEPS) -> bool:
    """True when the `shards_finished`-th shard crosses into a new tenth of the job.
    The last shard never is: the job's final event reports it."""
    if not 0 < shards_finished < shards_total:
        return False
    return shards_finished * num_steps // shards_total > (shards_finished - 1) * num_steps // shards_total


def _outbox_event(event: WebhookEvent, url: str) -> OutboxEvent:
    return OutboxEvent(id=event.event_id, type=event.type, url=url, body=event.body())
