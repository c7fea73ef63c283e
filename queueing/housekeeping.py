"""The housekeeper: every worker runs one, so recovery needs no extra process.

Each pass: reclaim shards whose lease expired (their worker died or hung) and send
them again, or dead-letter them; send again shards whose message seems lost, the
partial-manifest task of a job that ended unfinished if its manifest is still unwritten
long after, and the plan or finalize task of a job stranded in QUEUED, RUNNING with every
shard finished, or FINALIZING (jobs.recovery_store); refill each running job's window of
shards on the broker; write the job.stalled webhook event of a job nobody serves that asked
for it (jobs.unserved).

Every `tidy_s` (10 minutes) a pass also removes leftovers (`tidy`): the staged input files
of jobs that ended unfinished more than BARGE_STAGING_RETENTION_S ago, and the heartbeat
rows of workers gone for BARGE_WORKER_RETENTION_S."""

from __future__ import annotations

import logging
import threading
import time

from jobs.retention import prune_abandoned_staging
from jobs.unserved import notify_stalled
from jobs.status import JobStatus, ShardStatus
from jobs.worker_beats import WorkerBeats
from jobs.messaging import CONTROL_QUEUE, FINALIZE_JOB, PLAN_JOB, WRITE_PARTIAL_OUTPUT
from queueing.runtime import Runtime

log = logging.getLogger("barge.worker")


def housekeep(runtime: Runtime) -> None:
    store, options = runtime.store, runtime.options
    for reclaimed in store.reclaim_expired(max_attempts=options.max_attempts):
        if reclaimed.status == ShardStatus.PENDING:
            log.warning("job %s shard %d: lease expired, sending it again", reclaimed.job_id, reclaimed.shard_index)
            runtime.send_shards(store.get_job(reclaimed.job_id), [reclaimed.shard_index])
        else:
            log.error("job %s shard %d: dead-lettered after %d lost or failed attempts",
                      reclaimed.job_id, reclaimed.shard_index, options.max_attempts)
            if reclaimed.job_is_ready:
                runtime.send(FINALIZE_JOB, [reclaimed.job_id], CONTROL_QUEUE)
    for job_id, shard_index in store.stale_queued(options.requeue_after_s):
        log.warning("job %s shard %d: sent %.0fs ago and never claimed, sending it again",
                    job_id, shard_index, options.requeue_after_s)
        store.touch_queued(job_id, shard_index)
        runtime.send_shards(store.get_job(job_id), [shard_index])
    for job_id in store.stale_partial_outputs(options.requeue_after_s):
        log.warning("job %s: its partial manifest was owed %.0fs ago and is not written, sending the task again",
                    job_id, options.requeue_after_s)
        store.touch_partial_output(job_id)
        runtime.send(WRITE_PARTIAL_OUTPUT, [job_id], CONTROL_QUEUE)
    for job_id, status in store.stranded_jobs(options.requeue_after_s):
        task = PLAN_JOB if status == JobStatus.QUEUED else FINALIZE_JOB
        log.warning("job %s: %s, and the %s task that moves it on has not done so %.0fs after it was sent or "
                    "began; sending it again", job_id, status, task, options.requeue_after_s)
        runtime.send(task, [job_id], CONTROL_QUEUE)
        store.touch_task(job_id)
    for job_id in store.running_job_ids():
        runtime.refill_window(job_id)
    for job_id in notify_stalled(store):
        log.warning("job %s: no live worker serves its model; its job.stalled webhook event is written", job_id)


def tidy(runtime: Runtime) -> None:
    """Leftovers: nothing here is urgent, and each job is looked at once (jobs.recovery_store)."""
    removed = prune_abandoned_staging(runtime.store, runtime.options.staging_retention_s)
    if removed:
        log.info("tidied: the staged files of %d jobs that ended unfinished", len(removed))
    WorkerBeats(runtime.store.engine).prune(runtime.settings.worker_retention_s)   # dead workers' heartbeat rows


class Housekeeper(threading.Thread):
    def __init__(self, runtime: Runtime):
        super().__init__(name="barge-housekeeper", daemon=True)
        self.runtime = runtime
        self.stopped = threading.Event()

    def run(self) -> None:
        tidied_at = time.monotonic()   # the first tidy one interval after start: a fleet restarting does not stampede
        while not self.stopped.wait(self.runtime.options.housekeeping_s):
            try:
                housekeep(self.runtime)
                if time.monotonic() - tidied_at >= self.runtime.options.tidy_s:
                    tidied_at = time.monotonic()
                    tidy(self.runtime)
            except Exception:   # a database or broker blip must not kill the thread
                log.exception("housekeeping pass failed")

    def stop(self) -> None:
        self.stopped.set()
