"""Jobs whose owner seems gone: the SQL side of "no dead ends".

Every non-final state has an owner, a task that moves the job on, and `task_sent_at`
says when it was last sent or began (migration 0009):

    QUEUED                          plan_job        sent at submit, touched as it begins
    RUNNING, every shard finished   finalize_job    sent by the commit that finished the last shard
    FINALIZING                      finalize_job    touched as it begins (and re-enters)

A message lost on the way, a process killed mid-task, or a task that gave up on a
database or storage outage all leave the same trace: a job in one of these states whose
task is older than the housekeeper's `older_than_s`. Sending the task again is harmless:
plan and finalize are idempotent (queueing.planning, queueing.finalize). Shards (leases,
stale_queued), owed partial manifests and webhook events have owners of their own.
"""

from __future__ import annotations

import json
import time

from sqlalchemy import and_, func, or_, select, update

from jobs import tables
from jobs.status import JobStatus, ShardStatus


class RecoveryStore:
    def stranded_jobs(self, older_than_s: float, now: float | None = None) -> list[tuple[str, JobStatus]]:
        """(job id, status) of the QUEUED, ready-RUNNING and FINALIZING jobs whose task was
        sent or began more than `older_than_s` ago and did not move them on."""
        now = time.time() if now is None else now
        cutoff = now - older_than_s
        job, shard = tables.jobs.c, tables.shards.c
        task_at = func.coalesce(job.task_sent_at, job.updated_at)
        unfinished = [int(s) for s in ShardStatus if not s.is_finished]
        has_unfinished = (select(shard.job_id).where(shard.job_id == job.id, shard.status.in_(unfinished))
                          .exists())
        last_shard_at = (select(func.max(shard.updated_at)).where(shard.job_id == job.id)
                         .scalar_subquery())
        is_ready = and_(job.status == int(JobStatus.RUNNING), ~has_unfinished,
                        func.coalesce(last_shard_at, job.updated_at) < cutoff)
        query = select(job.id, job.status).where(task_at < cutoff, or_(
            job.status.in_([int(JobStatus.QUEUED), int(JobStatus.FINALIZING)]), is_ready))
        with self.engine.connect() as conn:
            return [(job_id, JobStatus(status)) for job_id, status in conn.execute(query).all()]

    def abandoned_staging(self, older_than_s: float, now: float | None = None, limit: int = 100) -> list[tuple[str, str]]:
        """(job id, output) of jobs that ended unfinished more than `older_than_s` ago whose
        staged files have not been removed yet, oldest first."""
        now = time.time() if now is None else now
        job = tables.jobs.c
        unfinished = [int(JobStatus.FAILED), int(JobStatus.CANCELLED), int(JobStatus.EXPIRED)]
        query = (select(job.id, job.spec).where(job.status.in_(unfinished), job.finished_at < now - older_than_s,
                                                job.staging_removed_at.is_(None))
                 .order_by(job.finished_at).limit(limit))
        with self.engine.connect() as conn:
            return [(job_id, json.loads(spec)["output"]) for job_id, spec in conn.execute(query).all()]

    def mark_staging_removed(self, job_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(staging_removed_at=now))

    def touch_task(self, job_id: str, now: float | None = None) -> None:
        """The job's task was sent again, or began, now."""
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(task_sent_at=now))
