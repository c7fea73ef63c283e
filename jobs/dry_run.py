"""`barge submit --dry-run`: the checks a job passes at submission, then the plan it would
get, described without queueing anything (footers and the id column are read; nothing
is staged or written). `barge status` shows the same layout as planning found it."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from jobs.inspection import planned_shards
from jobs.spec import JobSpec
from jobs.validate import check_job
from storage.layout import Layout, describe_layout

if TYPE_CHECKING:
    from jobs.store import Store


def dry_run(spec: JobSpec) -> Layout:
    """The layout planning would find; raises JobSpecError as submit would, except for
    duplicate ids, which the layout counts and names instead."""
    info = check_job(replace(spec, allow_duplicate_ids=True)).input
    return describe_layout(info, planned_shards(spec, info))


def planned_layout(store: Store, job_id: str) -> Layout | None:
    """The layout planning found (kept with the first shard, queueing.planning.input_summary);
    None before planning, or for a job planned before layouts were kept."""
    first = next(iter(store.list_shards(job_id)), None)
    layout = None if first is None else (first.plan.get("input") or {}).get("layout")
    return None if layout is None else Layout.from_dict(layout)
