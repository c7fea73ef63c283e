"""`barge submit --dry-run`: the checks a job passes at submission, then the plan it would
get, described without queueing anything (footers and the id column are read, and a
transcribe job's audio headers; nothing is staged or written). `barge status` shows the
same layout as planning found it (jobs.planned)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from jobs.inspection import planned_shards
from jobs.models import ModelRef
from jobs.spec import JobSpec
from jobs.validate import check_job
from storage.durations import with_durations
from storage.layout import Layout, describe_layout


def dry_run(spec: JobSpec, resolve: Callable[[str], ModelRef] | None = None) -> Layout:
    """The layout planning would find; raises JobSpecError as submit would, except for
    duplicate ids, which the layout counts and names instead. `resolve`: as check_job's."""
    info = check_job(replace(spec, allow_duplicate_ids=True), resolve).input
    if spec.mode == "transcribe":   # planned by audio seconds, as planning does (the audio column is read)
        info, _ = with_durations(info, spec.input_column)
    return describe_layout(info, planned_shards(spec, info))

