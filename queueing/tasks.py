"""The Celery tasks: thin wrappers that hand the worker's runtime to the real steps.

Messages carry ids only (job id, shard index); everything else is read from SQL. The
tasks' names are jobs.messaging's, which the client sends to as well.

run_shard is acknowledged when it starts, not when it ends: a shard's safety comes from
its lease in SQL (queueing.housekeeping reclaims the shard of a worker that died), so a
long shard never outlives a broker's visibility timeout (Redis) or consumer timeout
(RabbitMQ) and is never run twice because of one. Planning and finalizing are short
and acknowledged late: a worker lost mid-way means the broker delivers them again.
"""

from __future__ import annotations

import logging

from celery import shared_task

from jobs.logs import log_context
from jobs.messaging import FINALIZE_JOB, PLAN_JOB, RESUME_JOB, RUN_SHARD, WRITE_PARTIAL_OUTPUT
from queueing import finalize, planning, worker
from queueing.runtime import runtime_of

log = logging.getLogger("barge.worker")


@shared_task(name=PLAN_JOB, bind=True)
def plan_job(self, job_id: str) -> None:
    runtime = runtime_of(self.app)
    with log_context(job_id=job_id):
        finalize.run_job_step(runtime, job_id, "planning", lambda: planning.plan_job(runtime, job_id))


@shared_task(name=RUN_SHARD, bind=True, acks_late=False)
def run_shard(self, job_id: str, shard_index: int) -> None:
    """With the pipeline (queueing.pipeline): claim and read here, then hand the shard to
    the engine thread and return for the next message. Without it: the whole attempt."""
    runtime = runtime_of(self.app)
    with log_context(job_id=job_id, shard_id=shard_index):
        if runtime.pipeline is not None:
            started = worker.begin_shard(runtime, job_id, shard_index)
            if isinstance(started, worker.ShardOutcome):
                runtime.metrics.shard_attempts.labels(started.status).inc()
                log.info("shard %s before any engine work", started.status)
            elif started.claim.attempt == 1:
                runtime.pipeline.submit(started)
            else:   # a retry runs alone (queueing.pipeline's NOTE)
                with runtime.metrics.shard_attempt() as finished:
                    outcome = worker.continue_shard(runtime, started)
                    finished(outcome.status, outcome.usage)
                    log.info("shard %s: %d rows, %d failed", outcome.status, outcome.num_rows, outcome.rows_failed)
            return
        with runtime.metrics.shard_attempt() as finished:
            outcome = worker.run_shard(runtime, job_id, shard_index)
            finished(outcome.status, outcome.usage)
            log.info("shard %s: %d rows, %d failed", outcome.status, outcome.num_rows, outcome.rows_failed)


@shared_task(name=RESUME_JOB, bind=True)
def resume_job(self, job_id: str) -> None:
    """A retried job: send its window of shards again."""
    with log_context(job_id=job_id):
        runtime_of(self.app).refill_window(job_id)


@shared_task(name=FINALIZE_JOB, bind=True)
def finalize_job(self, job_id: str) -> None:
    runtime = runtime_of(self.app)
    with log_context(job_id=job_id):
        finalize.run_job_step(runtime, job_id, "finalizing", lambda: finalize.finalize_job(runtime, job_id))


@shared_task(name=WRITE_PARTIAL_OUTPUT, bind=True)
def write_partial_output(self, job_id: str) -> None:
    """An expired, cancelled or failed job: the manifest of the shards it committed."""
    with log_context(job_id=job_id):
        finalize.write_partial_output(runtime_of(self.app), job_id)
