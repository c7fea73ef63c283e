"""finalize_job: once every shard is finished, commit the output (manifest, then
_SUCCESS) and record the final state together with its webhook event.

A job that ends unfinished (expired, cancelled, failed) gets `write_partial_output`:
a manifest of the shards it did commit, marked with its status, and no _SUCCESS
(storage.manifest)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from jobs.status import JobStatus, ShardStatus
from jobs.events import final_event
from jobs.report import job_report
from jobs.failpoints import failpoint
from jobs.transient import is_transient, retrying
from queueing.dispatch import deliver
from queueing.runtime import Runtime
from queueing.structured_stats import structured_stats
from queueing.top_n_output import wants_top_n, write_top_n
from storage.errors import StorageError
from queueing.results import ROW_INDEX_COLUMN
from storage.errors_file import write_errors_file
from storage.manifest import Manifest, commit_output, write_partial_manifest
from storage.write import PartInfo

log = logging.getLogger("barge.worker")


def run_job_step(runtime: Runtime, job_id: str, step: str, action: Callable[[], object]) -> None:
    """Plan or finalize a job. A transient error (jobs.transient: the database, the
    broker or the store away for a while) is retried with backoff for
    BARGE_TRANSIENT_RETRY_S and, past that, left to the job's owner, a housekeeper that
    sends the task again (jobs.recovery_store): the job stays as it is, never FAILED
    over an outage. Any other error fails the job with the reason."""
    within_s = runtime.options.transient_retry_s
    try:
        retrying(f"job {job_id}: {step}", action, within_s=within_s)
        return
    except Exception as exc:
        if is_transient(exc):
            log.warning("job %s: %s met an outage that outlasted %.0fs of retries (%s: %s); the job stays as "
                        "it is until a housekeeper sends the task again", job_id, step, within_s,
                        type(exc).__name__, exc)
            return
        log.exception("job %s: %s failed", job_id, step)
        error = f"{step} failed: {type(exc).__name__}: {exc}"
    try:
        retrying(f"job {job_id}: recording that {step} failed", lambda: fail_job(runtime, job_id, error),
                 within_s=within_s)
    except Exception:   # still away: the re-sent task meets the same error and records it then
        log.exception("job %s: could not record that %s failed; a housekeeper sends the task again", job_id, step)


def finalize_job(runtime: Runtime, job_id: str) -> JobStatus | None:
    store = runtime.store
    if not store.begin_finalize(job_id):
        return None
    failpoint("after_begin_finalize")
    job = store.get_job(job_id)
    shards = store.list_shards(job_id)
    failed = [s for s in shards if s.status == ShardStatus.FAILED]
    if failed:
        first = failed[0]
        status = finish(runtime, job_id, JobStatus.FAILED,
                        error=f"{len(failed)} of {len(shards)} shards failed; shard {first.shard_index}: {first.error}")
        if status is not None:
            write_partial_output(runtime, job_id)
        return status
    try:
        commit_output(job.spec.output, build_manifest(runtime, job, shards, "succeeded"),
                      before_success=lambda: failpoint("after_manifest_before_success"))
    except StorageError as exc:
        if is_transient(exc):   # the store is away: run_job_step retries, then the job's owner
            raise
        return finish(runtime, job_id, JobStatus.FAILED, error=f"committing the output failed: {exc}")
    return finish(runtime, job_id, JobStatus.SUCCEEDED)


def write_partial_output(runtime: Runtime, job_id: str) -> bool:
    """After a job ended expired, cancelled or failed: list the parts of its committed
    shards in a manifest marked with that status (no _SUCCESS). Its shards are final by
    then (ending the job took every claim back), so the list cannot grow behind it.
    False, logged, if the output could not be written: the job's state stands, and the
    manifest stays owed (Store.stale_partial_outputs). Written, it releases the job's
    final webhook, held for it (jobs.store.PARTIAL_OUTPUT_HOLD_S), and tries it at once."""
    job = runtime.store.get_job(job_id)
    status = JobStatus(job.status)
    if status not in (JobStatus.EXPIRED, JobStatus.CANCELLED, JobStatus.FAILED):
        raise ValueError(f"job {job_id} is {status}: only an unfinished job gets a partial manifest")
    shards = [s for s in runtime.store.list_shards(job_id) if s.status == ShardStatus.COMMITTED]
    try:
        write_partial_manifest(job.spec.output, build_manifest(runtime, job, shards, str(status)))
    except StorageError:
        log.exception("job %s: writing the partial manifest failed", job_id)
        return False    # still owed: a housekeeper sends the task again (queueing.housekeeping)
    log.info("job %s: %s with %d committed shards listed in its manifest", job_id, status, len(shards))
    for event_id in runtime.store.partial_output_written(job_id):    # its final webhook, held until now
        deliver(runtime, event_id)
    return True


def build_manifest(runtime: Runtime, job, shards: list, status: str) -> Manifest:
    """The manifest of `shards` (committed, in order), writing the errors file first if
    the job asked for one and any of their rows failed, and a succeeded score job's
    top_n.parquet if it asked for one (queueing.top_n_output)."""
    parts = tuple(PartInfo(**s.part) for s in shards)
    errors_file = None
    if job.spec.errors_file and any(s.rows_failed for s in shards):
        errors_file = write_errors_file(job.spec.output, parts, id_column=job.spec.id_column or ROW_INDEX_COLUMN)
    top_n_file = write_top_n(job, parts) if status == "succeeded" and wants_top_n(job.spec) else None
    return Manifest(job_id=job.id, mode=job.spec.mode, model=job.spec.model, spec=job.spec.to_dict(), parts=parts,
                    schema=job.output_schema, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    stats={**manifest_stats(runtime, job.id), **structured_stats(job.spec, parts)},
                    errors_file=errors_file, status=status, top_n_file=top_n_file)


def manifest_stats(runtime: Runtime, job_id: str) -> dict:
    """The job's report (jobs.report), with the counts the manifest always carried."""
    report = job_report(runtime.store, job_id, price_per_hour=runtime.settings.price_per_hour).to_dict()
    for name in ("job_id", "status", "mode", "model"):   # the manifest has them, or they are not final yet
        report.pop(name)
    return {**report, "seconds": report["throughput"]["running_s"]}


def fail_job(runtime: Runtime, job_id: str, error: str) -> JobStatus | None:
    return finish(runtime, job_id, JobStatus.FAILED, error=error)


def finish(runtime: Runtime, job_id: str, status: JobStatus, *, error: str | None = None) -> JobStatus | None:
    """Record the final state and its webhook event in one transaction, then try the
    first delivery at once; the dispatcher retries it if that attempt fails."""
    event = final_event(runtime.store, job_id, status, error)
    if not runtime.store.finish_job(job_id, status, error=error, event=event):
        return None
    failpoint("after_final_status_before_event")
    log.info("job %s: %s%s", job_id, status, f" ({error})" if error else "")
    if event is not None:
        deliver(runtime, event.id)
    return status
