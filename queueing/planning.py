"""plan_job: read the input's footers (and its id column), stage row groups bigger than a
shard, record the shards, queue one task per shard."""

from __future__ import annotations

import logging

from jobs.status import JobStatus
from jobs.spec import JobSpecError
from jobs.validate import check_ids, inspect_job_input, read_columns
from jobs.failpoints import failpoint
from jobs.messaging import CONTROL_QUEUE, FINALIZE_JOB, model_queue
from jobs.transient import is_transient
from jobs.inspection import planned_shards
from queueing.finalize import fail_job
from queueing.runtime import Runtime
from storage.errors import StorageError
from storage.clear import clear_output
from storage.durations import Durations, with_durations
from storage.inspection import load_inspection
from storage.layout import Layout, describe_layout
from storage.plan import InputInfo
from storage.stage import StagingReport, remove_staging, stage_split_pieces, staging_url

log = logging.getLogger("barge.worker")


def plan_job(runtime: Runtime, job_id: str) -> int:
    """Plan and enqueue the job's shards; returns how many were queued."""
    store = runtime.store
    job = store.get_job(job_id)
    if job.status != JobStatus.QUEUED:
        log.info("job %s: already %s, not planning again", job_id, job.status)
        return 0
    store.touch_task(job_id)   # planning began: its owner waits BARGE_REQUEUE_AFTER_S from now (jobs.recovery_store)
    spec = job.spec
    try:
        # Submit's inspection when it kept one (jobs.inspection): no footer is read again.
        info = load_inspection(staging_url(spec.output, job_id)) or inspect_job_input(
            spec, summarize_ids=bool(spec.id_column))
        check_ids(spec, info)
        durations = None
        if spec.mode == "transcribe":   # shards bounded by audio seconds, from the files' headers
            info, durations = with_durations(info, spec.input_column)
        shards = planned_shards(spec, info)
        if spec.if_exists == "replace":
            clear_output(spec.output)
        shards, staging = stage_split_pieces(shards, read_columns(spec), staging_url(spec.output, job_id))
    except (StorageError, JobSpecError) as exc:   # the input changed since submission, its ids repeat, ...
        if is_transient(exc):   # the store is away, not the input wrong: retried, never a failed job
            raise
        remove_staging(spec.output, job_id)   # a retry plans afresh, from the input as it is then
        fail_job(runtime, job_id, f"planning failed: {exc}")
        return 0
    if staging.num_files:
        log.info("job %s: staged %d row groups bigger than a shard as %d files, %d bytes, in %.1f s", job_id,
                 staging.num_row_groups, staging.num_files, staging.num_bytes_written, staging.seconds)
    plans = [shard.to_dict() for shard in shards]
    if plans:
        plans[0]["input"] = input_summary(info, staging, describe_layout(info, shards), durations)
    failpoint("before_plan_commit")
    if not store.start_job(job_id, plans):
        return 0
    if not plans:
        runtime.send(FINALIZE_JOB, [job_id], CONTROL_QUEUE)
    num_sent = runtime.refill_window(job_id)
    log.info("job %s: %d rows in %d shards; the first %d sent to %s", job_id, info.num_rows, len(plans),
             num_sent, model_queue(job.model_key))
    return len(plans)


def input_summary(info: InputInfo, staging: StagingReport, layout: Layout, durations: Durations | None) -> dict:
    """What planning found, kept with the first shard for the job's report, manifest and status."""
    ids = info.ids
    audio = {} if durations is None else {"audio_seconds": round(durations.total_seconds, 3),
                                          "num_unknown_durations": durations.num_unknown}
    return {"num_duplicate_ids": ids.num_duplicate_rows if ids else 0, "num_null_ids": ids.num_null if ids else 0,
            "staged_row_groups": staging.num_row_groups, "staged_bytes": staging.num_bytes_written,
            "staging_s": round(staging.seconds, 3), "layout": layout.to_dict(), **audio}
