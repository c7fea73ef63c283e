"""OpenAI's Batch object for a batch record and the progress of its job: status,
request_counts and timestamps all come from the job; the batch is final only once its
output and error files are written (`settled_at`).

    job              batch (not settled)           batch (settled)
    QUEUED           validating
    RUNNING          in_progress
    FINALIZING       finalizing
    SUCCEEDED        finalizing (files being made)  completed
    CANCELLED        cancelling                     cancelled
    EXPIRED          finalizing                     expired
    FAILED           finalizing                     failed
    (no job: refused at validation)                 failed, with errors
"""

from __future__ import annotations

from jobs.api_batches import BatchRecord
from jobs.records import JobProgress
from jobs.status import JobStatus

SETTLED_STATUS = {JobStatus.SUCCEEDED: "completed", JobStatus.CANCELLED: "cancelled",
                  JobStatus.EXPIRED: "expired", JobStatus.FAILED: "failed"}


def batch_status(batch: BatchRecord, job: JobProgress | None) -> str:
    if job is None:   # refused, or its job never made (settled failed); else its job is being made
        return "failed" if batch.errors or batch.settled_at is not None else "validating"
    if batch.settled_at is not None:
        return SETTLED_STATUS[job.status]
    if job.status == JobStatus.CANCELLED or (batch.cancelling_at is not None and not job.is_finished):
        return "cancelling"
    if job.status == JobStatus.QUEUED:
        return "validating"
    if job.status == JobStatus.RUNNING:
        return "in_progress"
    return "finalizing"


def batch_object(batch: BatchRecord, job: JobProgress | None, window_s: int) -> dict:
    status = batch_status(batch, job)
    times = _times(batch, job, status)
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint, "model": batch.model,
        "errors": None if not batch.errors else {"object": "list", "data": batch.errors},
        "input_file_id": batch.input_file_id, "completion_window": batch.completion_window, "status": status,
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at), "expires_at": int(batch.created_at + window_s),
        **times, "request_counts": request_counts(batch, job), "metadata": batch.metadata or None,
        "usage": _usage(batch.usage),
    }


def _usage(usage: dict | None) -> dict | None:
    """OpenAI's BatchUsage, once settled. Nothing is served from a cache and nothing reasons."""
    if usage is None:
        return None
    return {"input_tokens": usage["input_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["output_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["input_tokens"] + usage["output_tokens"]}


def request_counts(batch: BatchRecord, job: JobProgress | None) -> dict:
    """Exact once settled; while the job runs, its rows scaled to lines (a line may hold
    several embedding inputs or prompts)."""
    total = batch.num_requests
    if batch.settled_at is not None or job is None:
        return {"total": total, "completed": batch.num_completed or 0, "failed": batch.num_failed or 0}
    scale = total / job.rows_total if job.rows_total else 0.0
    return {"total": total, "completed": int(job.rows_succeeded * scale), "failed": int(job.rows_failed * scale)}


def _times(batch: BatchRecord, job: JobProgress | None, status: str) -> dict:
    def seconds(value: float | None) -> int | None:
        return None if value is None else int(value)

    finished = seconds(job.finished_at) if job is not None else None
    return {
        "in_progress_at": seconds(job.started_at) if job is not None else None,
        "finalizing_at": finished if job is not None and job.status == JobStatus.SUCCEEDED else None,
        "completed_at": seconds(batch.settled_at) if status == "completed" else None,
        "failed_at": (finished if job is not None else int(batch.created_at)) if status == "failed" else None,
        "expired_at": finished if status == "expired" else None,
        "cancelling_at": seconds(batch.cancelling_at),
        "cancelled_at": finished if status == "cancelled" else None,
    }
