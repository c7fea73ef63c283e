"""What submit keeps for planning: its inspection of the input, and the small files' rows.

Submit has read every footer, and a small remote file came whole with its footer.
`keep_inspection` writes both where planning finds them (the job's staging folder):
the inspection as JSON (storage.inspection) and each shard's small files as one bundle
(storage.bundle), cut along the plan `planned_shards` gives, which planning makes again
from the same inspection. Over a job each input byte is then fetched about once.
"""

from __future__ import annotations

import logging

from jobs.spec import JobSpec
from jobs.validate import read_columns
from storage.bundle import stage_small_files
from storage.errors import StorageError
from storage.fs import is_local, resolve
from storage.inputs import InputInfo
from storage.inspection import save_inspection
from storage.plan import ShardPlan, plan_shards
from storage.stage import staging_url
from storage.work import AUDIO_SECONDS

log = logging.getLogger("barge.client")


def planned_shards(spec: JobSpec, info: InputInfo) -> list[ShardPlan]:
    """The job's plan over `info`: the one place a spec's limits become plan_shards' arguments
    (work is tokens for text, audio seconds for audio: storage.work)."""
    max_work = spec.max_audio_seconds_per_shard if info.work_unit == AUDIO_SECONDS else spec.max_tokens_per_shard
    return plan_shards(info, max_rows_per_shard=spec.max_rows_per_shard, max_work_per_shard=max_work)


def is_remote_input(info: InputInfo) -> bool:
    return bool(info.files) and not is_local(resolve(info.files[0].url)[0])


def keep_inspection(spec: JobSpec, job_id: str, info: InputInfo) -> None:
    """Write the job's inspection and small-file bundles for planning; a remote input only (a
    local one is cheap to read again). A failed write is logged, never raised: planning then
    reads the input again, as it would without them."""
    if not is_remote_input(info):
        return
    staging = staging_url(spec.output, job_id)
    try:
        kept, report = stage_small_files(info, planned_shards(spec, info), read_columns(spec), staging)
        save_inspection(kept, staging)
    except (StorageError, OSError) as error:
        log.warning("job %s: submit's inspection is not kept, planning reads the footers again (%s)", job_id, error)
        return
    if report.num_files:
        log.info("job %s: %d small files staged as %d bundles, %d bytes, in %.1f s", job_id, report.num_files,
                 report.num_bundles, report.num_bytes_written, report.seconds)
