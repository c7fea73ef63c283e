"""Webhook event payloads: one typed value per job outcome, with deterministic bytes."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

FINAL_EVENT_TYPES = ("job.succeeded", "job.failed", "job.cancelled", "job.expired")
# Sent only to jobs that ask for them (JobSpec.webhook_events): many per job, or (job.stalled,
# at most once per job) news that only some submitters act on.
OPT_IN_EVENT_TYPES = ("job.progress", "shard.completed", "job.stalled")
EVENT_TYPES = FINAL_EVENT_TYPES + OPT_IN_EVENT_TYPES
PAYLOAD_VERSION = 1


@dataclass(frozen=True)
class WebhookEvent:
    """One event to deliver; its id doubles as the Standard Webhooks ``webhook-id``."""

    event_id: str  # "msg_" + uuid4 hex; the same on every retry, so receivers can dedupe
    type: str  # one of EVENT_TYPES
    job_id: str
    created_at: str  # ISO 8601 UTC, e.g. "2026-12-01T03:00:00.123456Z"
    data: dict = field(default_factory=dict)  # JSON-serialisable event details

    def __post_init__(self) -> None:
        if self.type not in EVENT_TYPES:
            raise ValueError(f"type: {self.type!r} is not one of {EVENT_TYPES}")

    def payload(self) -> dict:
        return {
            "id": self.event_id,
            "type": self.type,
            "timestamp": self.created_at,
            "version": PAYLOAD_VERSION,
            "data": self.data,
        }

    def body(self) -> bytes:
        # Sorted keys and compact separators: the same event always signs to the same
        # bytes, so a retried delivery is byte-identical to the first attempt.
        return json.dumps(
            self.payload(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")


def new_event_id() -> str:
    return "msg_" + uuid.uuid4().hex


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def job_event(
    type: str,
    *,
    job_id: str,
    status: str,
    rows_total: int,
    rows_succeeded: int,
    rows_failed: int,
    output: str | None,
    manifest_url: str | None,
    error: str | None,
    metadata: dict | None,
    timings: dict | None,
) -> WebhookEvent:
    """Build the event for a job that reached a final state."""
    if type not in FINAL_EVENT_TYPES:
        raise ValueError(f"type: {type!r} is not one of {FINAL_EVENT_TYPES}")
    data = {
        "job_id": job_id,
        "status": status,
        "rows": {"total": rows_total, "succeeded": rows_succeeded, "failed": rows_failed},
        "output": output,
        "manifest_url": manifest_url,
        "error": error,
        "metadata": dict(metadata or {}),
        "timings": dict(timings or {}),
    }
    return _new_event(type, job_id, data)


def shard_event(
    *, job_id: str, shard_index: int, rows_succeeded: int, rows_failed: int, part: str, metadata: dict | None
) -> WebhookEvent:
    """``shard.completed``: one shard's part file is committed."""
    data = {
        "job_id": job_id,
        "shard_index": shard_index,
        "rows": {"total": rows_succeeded + rows_failed, "succeeded": rows_succeeded, "failed": rows_failed},
        "part": part,
        "metadata": dict(metadata or {}),
    }
    return _new_event("shard.completed", job_id, data)


def progress_event(
    *, job_id: str, rows_total: int, rows_succeeded: int, rows_failed: int, shards_total: int,
    shards_finished: int, metadata: dict | None,
) -> WebhookEvent:
    """``job.progress``: the job's counts as of one more finished shard."""
    data = {
        "job_id": job_id,
        "status": "running",
        "rows": {"total": rows_total, "succeeded": rows_succeeded, "failed": rows_failed},
        "shards": {"total": shards_total, "finished": shards_finished},
        "metadata": dict(metadata or {}),
    }
    return _new_event("job.progress", job_id, data)


def stalled_event(*, job_id: str, status: str, model: str, last_served_at: float | None, reason: str,
                  metadata: dict | None) -> WebhookEvent:
    """``job.stalled``: the job has work to do and no live worker serves its model
    (jobs.unserved); sent once per job, the first time a housekeeper sees it so."""
    data = {
        "job_id": job_id,
        "status": status,
        "model": model,
        "last_served_at": last_served_at,   # unix seconds of the last beat of a worker serving it; None: never
        "reason": reason,
        "metadata": dict(metadata or {}),
    }
    return _new_event("job.stalled", job_id, data)


def _new_event(type: str, job_id: str, data: dict) -> WebhookEvent:
    return WebhookEvent(event_id=new_event_id(), type=type, job_id=job_id, created_at=utc_now_iso(), data=data)
