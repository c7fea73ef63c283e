"""The webhook event that goes with a job's final state (written to the outbox in the
same transaction as the state change)."""

from __future__ import annotations

import time

from jobs.status import JobStatus
from jobs.store import OutboxEvent, Store
from webhooks.events import job_event

STATUS_EVENTS = {JobStatus.SUCCEEDED: "job.succeeded", JobStatus.FAILED: "job.failed",
                 JobStatus.CANCELLED: "job.cancelled"}


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
    return OutboxEvent(id=event.event_id, type=event.type, url=job.spec.webhook_url, body=event.body())
