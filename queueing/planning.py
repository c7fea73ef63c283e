"""plan_job: read the input's footers, record the shards, queue one task per shard."""

from __future__ import annotations

import dataclasses
import logging

from jobs.status import JobStatus
from jobs.validate import inspect_job_input
from queueing.finalize import fail_job
from queueing.routing import CONTROL_QUEUE, model_queue
from queueing.runtime import Runtime
from storage.errors import StorageError
from storage.clear import clear_output
from storage.plan import plan_shards

log = logging.getLogger("barge.worker")


def plan_job(runtime: Runtime, job_id: str) -> int:
    """Plan and enqueue the job's shards; returns how many were queued."""
    store = runtime.store
    job = store.get_job(job_id)
    if job.status != JobStatus.QUEUED:
        log.info("job %s: already %s, not planning again", job_id, job.status)
        return 0
    spec = job.spec
    try:
        info = inspect_job_input(spec)
        shards = plan_shards(info, max_rows_per_shard=spec.max_rows_per_shard,
                             max_work_per_shard=spec.max_tokens_per_shard)
        if spec.if_exists == "replace":
            clear_output(spec.output)
    except StorageError as exc:   # the input changed since submission, or the output vanished
        fail_job(runtime, job_id, f"planning failed: {exc}")
        return 0
    file_offsets = _file_offsets([f.num_rows for f in info.files])
    plans = [dict(dataclasses.asdict(shard), row_groups=list(shard.row_groups),
                  global_row_start=file_offsets[shard.file_index] + shard.row_start)
             for shard in shards]
    if not store.start_job(job_id, plans):
        return 0
    if not plans:
        runtime.send("barge.finalize_job", [job_id], CONTROL_QUEUE)
    num_sent = runtime.refill_window(job_id)
    log.info("job %s: %d rows in %d shards; the first %d sent to %s", job_id, info.num_rows, len(plans),
             num_sent, model_queue(job.model_key))
    return len(plans)


def _file_offsets(file_rows: list[int]) -> list[int]:
    offsets, total = [], 0
    for num_rows in file_rows:
        offsets.append(total)
        total += num_rows
    return offsets
