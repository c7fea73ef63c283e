"""The housekeeper removes the staged files of one-off jobs that ended unfinished, once
they are past BARGE_STAGING_RETENTION_S (issue 41: only `barge schedule prune` removed
them, so a job never retried kept its `_barge_staging/` for good). A job within the
retention keeps them for a retry, a succeeded or running job is never looked at, each job
is looked at once, and a retry makes its job a candidate again. SQLite and PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import update

from jobs import tables
from jobs.retention import prune_abandoned_staging
from jobs.status import JobStatus
from storage.stage import staging_url
from tests.integration.test_store import new_job, postgres_url, store, store_url  # noqa: F401 - fixtures

DAY = 86_400.0


def ended(store, tmp_path: Path, status: JobStatus, days_ago: float) -> tuple[str, Path]:
    """A job that ended `days_ago`, with staged files under its output."""
    job_id = new_job(store, output=str(tmp_path / "out" / status.name.lower() / str(days_ago)))
    finished_at = time.time() - days_ago * DAY
    with store.engine.begin() as conn:
        conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id)
                     .values(status=int(status), finished_at=finished_at))
    staging = Path(staging_url(store.get_job(job_id).spec.output, job_id))
    staging.mkdir(parents=True)
    (staging / "00000-000000000000.parquet").write_bytes(b"staged rows")
    return job_id, staging


def test_old_unfinished_jobs_lose_their_staging_once_and_a_retry_makes_them_candidates_again(store, tmp_path):
    failed, failed_staging = ended(store, tmp_path, JobStatus.FAILED, 8)
    cancelled, cancelled_staging = ended(store, tmp_path, JobStatus.CANCELLED, 9)
    expired, expired_staging = ended(store, tmp_path, JobStatus.EXPIRED, 10)
    recent, recent_staging = ended(store, tmp_path, JobStatus.FAILED, 1)
    succeeded, succeeded_staging = ended(store, tmp_path, JobStatus.SUCCEEDED, 30)   # storage.manifest's to remove

    removed = prune_abandoned_staging(store, retention_s=7 * DAY)
    assert sorted(removed) == sorted(map(str, (failed_staging, cancelled_staging, expired_staging)))
    assert not failed_staging.exists() and not cancelled_staging.exists() and not expired_staging.exists()
    assert recent_staging.exists() and succeeded_staging.exists()
    assert store.abandoned_staging(7 * DAY) == []   # each looked at once

    store.retry_job(failed)   # re-planned from scratch, it may stage again
    with store.engine.begin() as conn:
        conn.execute(update(tables.jobs).where(tables.jobs.c.id == failed)
                     .values(status=int(JobStatus.FAILED), finished_at=time.time() - 8 * DAY))
    failed_staging.mkdir(parents=True)
    assert [job_id for job_id, _ in store.abandoned_staging(7 * DAY)] == [failed]
    assert prune_abandoned_staging(store, retention_s=7 * DAY) == [str(failed_staging)]


def test_a_job_whose_staging_cannot_be_removed_now_is_tried_again(store, tmp_path, monkeypatch):
    job_id, staging = ended(store, tmp_path, JobStatus.FAILED, 8)
    import jobs.retention

    def unreachable(*_args):
        raise OSError("the storage is unreachable")

    monkeypatch.setattr(jobs.retention, "remove_staging", unreachable)
    assert prune_abandoned_staging(store, retention_s=7 * DAY) == []
    assert [found for found, _ in store.abandoned_staging(7 * DAY)] == [job_id]   # still a candidate
    monkeypatch.undo()
    assert prune_abandoned_staging(store, retention_s=7 * DAY) == [str(staging)]
