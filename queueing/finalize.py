"""finalize_job: once every shard is finished, commit the output (manifest, then
_SUCCESS) and record the final state together with its webhook event."""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

from jobs.status import JobStatus, ShardStatus
from jobs.events import final_event
from jobs.report import job_report
from queueing.dispatch import deliver
from queueing.runtime import Runtime
from storage.errors import StorageError
from queueing.results import ROW_INDEX_COLUMN
from storage.errors_file import write_errors_file
from storage.manifest import Manifest, commit_output
from storage.write import PartInfo

log = logging.getLogger("barge.worker")


@contextmanager
def failing_job_on_error(runtime: Runtime, job_id: str, step: str) -> Iterator[None]:
    """A crash in planning or finalizing fails the job with the reason, instead of
    leaving it QUEUED or FINALIZING for ever."""
    try:
        yield
    except Exception as exc:
        log.exception("job %s: %s failed", job_id, step)
        fail_job(runtime, job_id, f"{step} failed: {type(exc).__name__}: {exc}")


def finalize_job(runtime: Runtime, job_id: str) -> JobStatus | None:
    store = runtime.store
    if not store.begin_finalize(job_id):
        return None
    job = store.get_job(job_id)
    shards = store.list_shards(job_id)
    failed = [s for s in shards if s.status == ShardStatus.FAILED]
    if failed:
        first = failed[0]
        return finish(runtime, job_id, JobStatus.FAILED,
                      error=f"{len(failed)} of {len(shards)} shards failed; shard {first.shard_index}: {first.error}")
    parts = tuple(PartInfo(**s.part) for s in shards)
    progress = store.progress(job_id)
    try:
        errors_file = None
        if job.spec.errors_file and progress.rows_failed:
            errors_file = write_errors_file(job.spec.output, parts, id_column=job.spec.id_column or ROW_INDEX_COLUMN)
        manifest = Manifest(
            job_id=job_id, mode=job.spec.mode, model=job.spec.model, spec=job.spec.to_dict(), parts=parts,
            schema=job.output_schema, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            stats=manifest_stats(runtime, job_id), errors_file=errors_file)
        commit_output(job.spec.output, manifest)
    except StorageError as exc:
        return finish(runtime, job_id, JobStatus.FAILED, error=f"committing the output failed: {exc}")
    return finish(runtime, job_id, JobStatus.SUCCEEDED)


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
    log.info("job %s: %s%s", job_id, status, f" ({error})" if error else "")
    if event is not None:
        deliver(runtime, event.id)
    return status
