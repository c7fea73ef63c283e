"""`barge schedule prune` removes the staging folder that a job which ended unfinished kept
for a retry (storage.stage), once the job is past its schedule's retention; a job within
retention keeps it, and a dry run removes nothing."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import update

from jobs import tables
from jobs.status import JobStatus
from storage.stage import staging_url
from tests.integration.test_retention import DAY, FIRST, client, five_nights  # noqa: F401 - the fixture


def fail_with_staging(client, job_id: str) -> Path:
    """The job ended unfinished, its staged files left for a retry that never comes."""
    with client.store.engine.begin() as conn:
        conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(status=int(JobStatus.FAILED)))
    staging = Path(staging_url(client.job(job_id).status().output, job_id))
    staging.mkdir(parents=True, exist_ok=True)
    for name in ("input.json", "small-00000.parquet", "00000-000000000000.parquet"):
        (staging / name).write_text("x")
    return staging


def test_prune_removes_the_staging_of_old_unfinished_jobs_only(client, tmp_path):
    runs = five_nights(client, tmp_path)
    old, recent = fail_with_staging(client, runs[0].job_id), fail_with_staging(client, runs[4].job_id)
    now = FIRST + 4 * DAY + 60

    dry = client.schedules.prune("nightly", dry_run=True, now=now)
    assert dry.staging == [str(old)] and old.exists()
    assert f"would remove staged files {old}" in dry.lines()

    report = client.schedules.prune("nightly", now=now)
    assert report.staging == [str(old)]
    assert not old.exists() and not old.parent.exists(), "no job has staged files there any more"
    assert recent.exists(), "a job within retention may still be retried"
    assert client.schedules.prune("nightly", now=now).staging == []   # nothing left to remove
