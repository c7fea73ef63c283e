"""The Celery tasks: thin wrappers that hand the worker's runtime to the real steps.

Messages carry ids only (job id, shard index); everything else is read from SQL."""

from __future__ import annotations

from celery import shared_task

from queueing import finalize, planning, worker
from queueing.runtime import runtime_of


@shared_task(name="barge.plan_job", bind=True)
def plan_job(self, job_id: str) -> None:
    runtime = runtime_of(self.app)
    with finalize.failing_job_on_error(runtime, job_id, "planning"):
        planning.plan_job(runtime, job_id)


@shared_task(name="barge.run_shard", bind=True)
def run_shard(self, job_id: str, shard_index: int) -> None:
    outcome = worker.run_shard(runtime_of(self.app), job_id, shard_index)
    if outcome.retry_in_s is not None:
        # The attempt count lives in SQL (the shard row), not in Celery's retry counter.
        raise self.retry(countdown=outcome.retry_in_s, max_retries=None)


@shared_task(name="barge.finalize_job", bind=True)
def finalize_job(self, job_id: str) -> None:
    runtime = runtime_of(self.app)
    with finalize.failing_job_on_error(runtime, job_id, "finalizing"):
        finalize.finalize_job(runtime, job_id)
