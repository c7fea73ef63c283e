"""Which opt-in events a shard commit writes: a pure decision on the commit's counts."""

import pytest

from jobs.events import is_progress_step, shard_events
from jobs.records import JobRecord
from jobs.spec import JobSpec
from jobs.status import JobStatus
from jobs.store import ShardCommitted


@pytest.mark.parametrize(
    "shards_total, expected_steps",
    [(1, []), (2, [1]), (5, [1, 2, 3, 4]), (10, list(range(1, 10))), (20, list(range(2, 20, 2))),
     (1000, list(range(100, 1000, 100)))],
)
def test_progress_every_tenth_never_the_last(shards_total, expected_steps):
    assert [n for n in range(shards_total + 1) if is_progress_step(n, shards_total)] == expected_steps


def job(**spec_changes) -> JobRecord:
    spec = JobSpec(mode="embed", model="m", input="a", output="/out/", **spec_changes)
    return JobRecord(id="j", status=JobStatus.RUNNING, spec=spec, model_key="m", rows_total=40, output_schema="s",
                     error=None, created_at=0.0, started_at=1.0, finished_at=None)


def commit(shards_finished: int) -> ShardCommitted:
    return ShardCommitted(job_id="j", shard_index=0, rows_succeeded=10, rows_failed=0, part_name="p",
                          shards_total=4, shards_finished=shards_finished, job_rows_succeeded=10 * shards_finished,
                          job_rows_failed=0)


def test_no_opt_in_no_builder():
    assert shard_events(job()) is None
    assert shard_events(job(webhook_url="https://example.com/h")) is None


def test_builder_writes_what_the_job_asked_for():
    build = shard_events(job(webhook_url="https://example.com/h", webhook_events=("shard.completed", "job.progress")))
    assert [e.type for e in build(commit(1))] == ["shard.completed", "job.progress"]
    assert [e.type for e in build(commit(4))] == ["shard.completed"]      # the final event covers the end
    assert all(e.url == "https://example.com/h" for e in build(commit(2)))
    only_progress = shard_events(job(webhook_url="https://example.com/h", webhook_events=["job.progress"]))
    assert [e.type for e in only_progress(commit(3))] == ["job.progress"]
