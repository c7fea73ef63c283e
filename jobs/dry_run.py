"""`barge submit --dry-run`: the checks a job passes at submission, then the plan it would
get, described without queueing anything (footers and the id column are read; nothing
is staged or written)."""

from __future__ import annotations

from jobs.spec import JobSpec
from jobs.validate import check_job, inspect_job_input
from storage.layout import Layout, describe_layout
from storage.plan import plan_shards


def dry_run(spec: JobSpec) -> Layout:
    """The layout planning would find; raises JobSpecError as submit would."""
    check_job(spec)
    info = inspect_job_input(spec, summarize_ids=bool(spec.id_column))
    shards = plan_shards(info, max_rows_per_shard=spec.max_rows_per_shard, max_work_per_shard=spec.max_tokens_per_shard)
    return describe_layout(info, shards)
