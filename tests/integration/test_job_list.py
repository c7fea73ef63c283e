"""Listing jobs a page at a time (jobs.job_list) on a real SQLite file and PostgreSQL:
given jobs whose created_at ties, when the list is walked page by page, then every job
comes once, newest first, ties broken by id; each job reads as `Store.progress` reads it;
and `barge jobs` prints a page and the command for the next one.

The cost with 100,000 jobs is measured by bench/listing_bench.py, not asserted here."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from cli.main import main as barge
from jobs import tables
from jobs.job_list import JobList
from jobs.status import JobStatus
from tests.integration.test_store import commit, make_plans, new_job, postgres_url, store, store_url  # noqa: F401

# created_at of the jobs the tests make, oldest first: ties within 100 and within 200
CREATED_AT = [100.0, 100.0, 100.0, 200.0, 200.0, 300.0, 400.0]


def jobs_created_at(store, created_at: list[float]) -> list[str]:
    """Jobs with these creation times; their ids in the order a listing must give them."""
    job_ids = [new_job(store) for _ in created_at]
    with store.engine.begin() as conn:
        for job_id, at in zip(job_ids, created_at):
            conn.execute(sa.update(tables.jobs).where(tables.jobs.c.id == job_id).values(created_at=at))
    return [job_id for at, job_id in sorted(zip(created_at, job_ids), reverse=True)]


def walk(listing: JobList, limit: int, **filters) -> list[list[str]]:
    pages, before = [], None
    while True:
        page = listing.page(limit=limit, before=before, **filters)
        pages.append([job.job_id for job in page.jobs])
        if page.next_before is None:
            return pages
        assert page.next_before == page.jobs[-1].job_id
        before = page.next_before


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 50])
def test_pages_give_every_job_once_newest_first_ties_broken_by_id(store, limit):
    expected = jobs_created_at(store, CREATED_AT)
    pages = walk(JobList(store.engine), limit)
    assert [job_id for page in pages for job_id in page] == expected
    assert all(len(page) == limit for page in pages[:-1]) and 0 < len(pages[-1]) <= limit


def test_a_job_submitted_between_pages_goes_to_the_first_page_not_the_next(store):
    expected = jobs_created_at(store, CREATED_AT)
    listing = JobList(store.engine)
    first = listing.page(limit=3)
    newer = new_job(store)   # created now: newer than all
    rest = listing.page(limit=10, before=first.next_before)
    assert [job.job_id for job in first.jobs + rest.jobs] == expected and rest.next_before is None
    assert listing.page(limit=1).jobs[0].job_id == newer


def test_a_status_filter_pages_within_that_status(store):
    expected = jobs_created_at(store, CREATED_AT)
    for job_id in expected[1::2]:
        store.finish_job(job_id, JobStatus.CANCELLED)
    listing = JobList(store.engine)
    assert [j for page in walk(listing, 2, status=JobStatus.CANCELLED) for j in page] == expected[1::2]
    assert [j for page in walk(listing, 2, status=JobStatus.QUEUED) for j in page] == expected[0::2]
    assert walk(listing, 2, status=JobStatus.RUNNING) == [[]]


def test_each_listed_job_reads_as_its_own_progress(store):
    running, done, queued = new_job(store), new_job(store), new_job(store)
    for job_id, num_shards in ((running, 3), (done, 2)):
        assert store.start_job(job_id, make_plans(num_shards))
        for index in range(2):
            claim = store.claim_shard(job_id, index, worker_id="w:1", lease_s=60)
            commit(store, job_id, index, claim.token, rows_failed=index)
    store.claim_shard(running, 2, worker_id="w:1", lease_s=60)
    assert store.begin_finalize(done)
    store.finish_job(done, JobStatus.SUCCEEDED)
    happened_earlier(store, 200.0)   # so the milliseconds between two reads move no rate
    listed = {job.job_id: job for job in JobList(store.engine).page(limit=10).jobs}
    assert set(listed) == {running, done, queued}
    for job_id in (running, done, queued):
        alone, paged = dict(vars(store.progress(job_id))), dict(vars(listed[job_id]))
        rates, alone_rates = vars(paged.pop("throughput")), vars(alone.pop("throughput"))
        assert paged == alone
        assert rates == {name: value if value is None else pytest.approx(value, rel=1e-3)
                         for name, value in alone_rates.items()}
    assert listed[running].shards == {"committed": 2, "running": 1} and listed[running].rows_failed == 1
    assert listed[running].throughput.recent_rows_per_s > 0 and listed[done].throughput.eta_s is None


def happened_earlier(store, seconds: float) -> None:
    """Every time in the jobs and shards tables moved `seconds` into the past."""
    with store.engine.begin() as conn:
        for table, names in ((tables.jobs, ("created_at", "started_at", "finished_at")),
                             (tables.shards, ("started_at", "finished_at"))):
            conn.execute(sa.update(table).values({name: table.c[name] - seconds for name in names}))


def test_a_page_sums_only_its_own_jobs_shards(store):
    older, newer = new_job(store), new_job(store)
    for job_id in (older, newer):
        assert store.start_job(job_id, make_plans(2))
    statements = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda conn, cursor, statement, params, context, many: statements.append((statement, params)))
    [listed] = JobList(store.engine).page(limit=1).jobs
    assert listed.job_id == newer
    [(_, params)] = [(sql, params) for sql, params in statements if "barge_shards" in sql]
    values = params.values() if isinstance(params, dict) else params
    assert newer in values and older not in values


def test_an_unknown_cursor_or_an_empty_page_is_refused(store):
    listing = JobList(store.engine)
    with pytest.raises(KeyError):
        listing.page(before="0" * 32)
    with pytest.raises(ValueError):
        listing.page(limit=0)


def test_barge_jobs_prints_a_page_and_the_command_for_the_next(store, monkeypatch, capsys):
    monkeypatch.setenv("BARGE_DATABASE_URL", store.url)
    expected = jobs_created_at(store, CREATED_AT)
    store.finish_job(expected[0], JobStatus.CANCELLED)
    assert barge(["jobs", "--limit", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB", "STATUS", "DONE", "FAILED", "TOTAL", "ROWS/S", "ETA", "OUTPUT"]
    assert [line.split()[:2] for line in lines[1:4]] == [[expected[0], "cancelled"], [expected[1], "queued"],
                                                          [expected[2], "queued"]]
    assert lines[4] == f"older jobs: barge jobs --limit 3 --before {expected[2]}"
    assert barge(["jobs", "--limit", "3", "--before", expected[5]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [expected[6]]   # the last page says nothing more
    assert barge(["jobs", "--status", "queued", "--limit", "5"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"older jobs: barge jobs --limit 5 --status queued --before {expected[5]}"
    assert barge(["jobs", "--before", "0" * 32]) == 1
    assert "no job" in capsys.readouterr().err
