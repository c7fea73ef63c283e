"""Stranded jobs on real databases: every non-final state has an owner, and the store
finds the jobs whose owner's task was sent (or began) too long ago and did not move
them on (jobs.recovery_store). SQLite and PostgreSQL alike.

Given a job left in some state by a lost message or a killed process, when time passes
beyond the housekeeper's threshold, then it is listed with the state that says which
task to send; a fresh one, one still working, or a finished one is not."""

from __future__ import annotations

import time

import pytest

from jobs.status import JobStatus
from tests.integration.test_store import (commit, new_job, postgres_url, running_job, store,  # noqa: F401
                                          store_url)

AFTER_S = 60.0


def later(seconds: float = AFTER_S + 1) -> float:
    return time.time() + seconds


def test_a_queued_job_is_stranded_once_its_plan_task_is_old(store):
    job_id = new_job(store)
    assert store.stranded_jobs(AFTER_S) == []
    assert store.stranded_jobs(AFTER_S, now=later()) == [(job_id, JobStatus.QUEUED)]
    store.touch_task(job_id, now=later())   # sent again (or planning began) then
    assert store.stranded_jobs(AFTER_S, now=later()) == []


def test_a_running_job_with_shards_to_do_is_not_stranded(store):
    job_id = running_job(store, num_shards=2)
    token = store.claim_shard(job_id, 0).token
    commit(store, job_id, 0, token)
    assert store.stranded_jobs(AFTER_S, now=later(3600)) == [], "its shards have owners of their own"


def test_a_running_job_whose_shards_all_finished_is_stranded_once_the_last_is_old(store):
    job_id = running_job(store, num_shards=2)
    for index in range(2):
        assert commit(store, job_id, index, store.claim_shard(job_id, index).token)[0]
    assert store.stranded_jobs(AFTER_S) == [], "the finalize the last commit sent may be on its way"
    assert store.stranded_jobs(AFTER_S, now=later()) == [(job_id, JobStatus.RUNNING)]


def test_a_running_job_without_shards_is_stranded_like_a_finished_one(store):
    job_id = new_job(store)
    assert store.start_job(job_id, [])
    assert store.stranded_jobs(AFTER_S, now=later()) == [(job_id, JobStatus.RUNNING)]


def test_a_finalizing_job_is_stranded_until_a_finalize_begins_again(store):
    job_id = running_job(store, num_shards=1)
    commit(store, job_id, 0, store.claim_shard(job_id, 0).token)
    assert store.begin_finalize(job_id)
    assert store.stranded_jobs(AFTER_S) == []
    assert store.stranded_jobs(AFTER_S, now=later()) == [(job_id, JobStatus.FINALIZING)]
    # The re-sent finalize re-enters and restarts the owner's clock.
    assert store.begin_finalize(job_id)
    assert store.get_job(job_id).status == JobStatus.FINALIZING
    assert store.stranded_jobs(AFTER_S) == []


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED])
def test_a_finished_job_is_never_stranded(store, status):
    job_id = running_job(store, num_shards=1)
    commit(store, job_id, 0, store.claim_shard(job_id, 0).token)
    assert store.begin_finalize(job_id)
    assert store.finish_job(job_id, status)
    assert store.stranded_jobs(AFTER_S, now=later(86_400)) == []


def test_a_cancelled_queued_job_is_never_stranded(store):
    job_id = new_job(store)
    assert store.finish_job(job_id, JobStatus.CANCELLED)
    assert store.stranded_jobs(AFTER_S, now=later(86_400)) == []


def test_a_retried_job_restarts_its_owners_clock(store):
    job_id = new_job(store)
    assert store.finish_job(job_id, JobStatus.FAILED, error="planning failed")
    assert store.retry_job(job_id) == JobStatus.QUEUED
    assert store.stranded_jobs(AFTER_S) == []
    assert store.stranded_jobs(AFTER_S, now=later()) == [(job_id, JobStatus.QUEUED)]
