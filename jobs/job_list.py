"""Jobs newest first, a page at a time, each with its shards summed: what `barge jobs`
(Client.job_page) and the dashboard's jobs list (api.dashboard.reads) read. One
implementation for both; `Store.progress` stays the read of one job.

A page is two queries, whatever the history:

    1. its jobs    WHERE (created_at, id) < (the cursor's)  ORDER BY created_at DESC, id DESC
                   LIMIT n + 1: a range of ix_barge_jobs_created (migration 0016), never
                   OFFSET, so a deep page reads what the first reads. Row n + 1 only says that
                   older jobs follow.
    2. its shards  one aggregate WHERE job_id IN (the page's n ids), grouped by job and shard
                   status, through an index led by job_id: the shards of every other job
                   are never read (PostgreSQL, a page of 200: 920 of 449,213 shard rows).

With 100,000 jobs (bench/listing_bench.py, 2-core AMD EPYC) a page of 20 takes 1.5 ms on
SQLite and 2.5 ms on PostgreSQL, the first page or one 90,000 jobs back. PostgreSQL needs
its statistics for that (autovacuum's ANALYZE): without them it reads an IN list by a
sequential scan of every shard (130 ms).

NOTE: the cursor is the id of the last job listed, resolved to its (created_at, id). Ties
in created_at are broken by id, so across pages no job is repeated or skipped, and jobs
submitted meanwhile land on the first page instead of shifting the later ones.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import Engine, Select, func, literal, select, tuple_

from jobs import tables
from jobs.records import JobProgress, JobRecord
from jobs.status import JobStatus, ShardStatus
from jobs.throughput import RECENT_WINDOW_S, JobTimes, measure

_job, _shard = tables.jobs.c, tables.shards.c


@dataclass(frozen=True)
class ShardSums:
    """One job's shards summed, as `Store.progress` sums them for one job."""

    shards: dict[str, int] = field(default_factory=dict)   # shard status name -> count (present ones only)
    rows_succeeded: int = 0             # of committed shards
    rows_failed: int = 0
    rows_reused: int = 0
    num_tokens: int = 0
    recent_rows: int = 0                # of shards committed within window_s before the job's end
    recent_tokens: int = 0              # (its finish, else the listing's `now`)
    first_started_at: float | None = None   # earliest attempt start over every shard
    worker_s: float = 0.0               # run time of finished attempts, every status
    window_s: float = RECENT_WINDOW_S

    @property
    def rows_done(self) -> int:
        return self.rows_succeeded + self.rows_failed

    def times(self, job: JobRecord, now: float) -> JobTimes:
        return JobTimes(now=now, created_at=job.created_at, finished_at=job.finished_at,
                        first_started_at=self.first_started_at, rows_total=job.rows_total, rows_done=self.rows_done,
                        num_tokens=self.num_tokens, recent_rows=self.recent_rows, recent_tokens=self.recent_tokens,
                        worker_s=self.worker_s, window_s=self.window_s)


NO_SHARDS = ShardSums()   # a job not planned yet


@dataclass(frozen=True)
class ListedRows:
    """A page of some query over barge_jobs (the caller's columns and filters)."""

    rows: list                          # the query's rows, newest first
    sums: dict[str, ShardSums]          # job id -> its shards; absent: none planned yet
    next_before: str | None             # the last row's id when older rows follow; None: the last page
    now: float                          # where unfinished jobs' recent windows end


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobProgress]             # newest first
    next_before: str | None             # pass as `before` for the next, older page; None: this is the last


class JobList:
    def __init__(self, engine: Engine, window_s: float = RECENT_WINDOW_S):
        self.engine = engine
        self.window_s = window_s

    def page(self, *, limit: int = 50, before: str | None = None, status: JobStatus | None = None) -> JobPage:
        """Every job (or those in `status`), `limit` at a time, each as `Store.progress` reports it."""
        query = select(tables.jobs)
        if status is not None:
            query = query.where(_job.status == int(status))
        listed = self.read(query, limit=limit, before=before)
        jobs = [JobRecord.from_row(row) for row in listed.rows]
        return JobPage([self.progress(job, listed.sums.get(job.id, NO_SHARDS), listed.now) for job in jobs],
                       listed.next_before)

    def read(self, query: Select, *, limit: int, before: str | None = None) -> ListedRows:
        """`query` (a select over barge_jobs, any joins and filters) a page at a time, with
        the page's shards summed. KeyError for a `before` that names no job."""
        if limit < 1:
            raise ValueError(f"a page holds at least 1 job, not {limit}")
        with self.engine.connect() as conn:
            if before is not None:
                cursor = conn.execute(select(_job.created_at, _job.id).where(_job.id == before)).one_or_none()
                if cursor is None:
                    raise KeyError(f"no job {before!r}")
                query = query.where(tuple_(_job.created_at, _job.id) < tuple_(cursor.created_at, cursor.id))
            rows = conn.execute(query.order_by(_job.created_at.desc(), _job.id.desc()).limit(limit + 1)).all()
            now = time.time()
            sums = self.sum_shards(conn, [row.id for row in rows[:limit]], now)
        return ListedRows(rows[:limit], sums, rows[limit - 1].id if len(rows) > limit else None, now)

    def sum_shards(self, conn, job_ids: list[str], now: float) -> dict[str, ShardSums]:
        """One aggregate over these jobs' shards (and no others)."""
        if not job_ids:
            return {}
        by_job = defaultdict(list)
        for row in conn.execute(shard_sums_query(job_ids, now, self.window_s)):
            by_job[row.job_id].append(row)
        return {job_id: _fold(per_status, self.window_s) for job_id, per_status in by_job.items()}

    def progress(self, job: JobRecord, sums: ShardSums, now: float) -> JobProgress:
        times = sums.times(job, now)
        return JobProgress(job_id=job.id, status=job.status, rows_total=job.rows_total,
                           rows_succeeded=sums.rows_succeeded, rows_failed=sums.rows_failed,
                           rows_reused=sums.rows_reused, shards=sums.shards, error=job.error, output=job.spec.output,
                           created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
                           num_tokens=sums.num_tokens, throughput=measure(times, is_finished=job.status.is_finished))


def shard_sums_query(job_ids: list[str], now: float, window_s: float) -> Select:
    """Per job and shard status present: what ShardSums holds. The recent window ends at the
    job's finish, else now, so a finished job's recent rate stays what it was."""
    is_recent = _shard.finished_at >= func.coalesce(_job.finished_at, literal(now)) - window_s
    rows = _shard.rows_succeeded + _shard.rows_failed
    return (select(_shard.job_id, _shard.status, func.count().label("num_shards"),
                   func.sum(_shard.rows_succeeded).label("succeeded"), func.sum(_shard.rows_failed).label("failed"),
                   func.sum(_shard.rows_reused).label("reused"), func.sum(_shard.num_tokens).label("tokens"),
                   func.sum(rows).filter(is_recent).label("recent_rows"),
                   func.sum(_shard.num_tokens).filter(is_recent).label("recent_tokens"),
                   func.min(_shard.started_at).label("first_started"),
                   func.sum(_shard.finished_at - _shard.started_at).label("run_s"))
            .join(tables.jobs, _job.id == _shard.job_id)   # by its primary key, for finished_at
            .where(_shard.job_id.in_(job_ids)).group_by(_shard.job_id, _shard.status))


def _fold(per_status: list, window_s: float) -> ShardSums:
    """A job's rows of `shard_sums_query` as one ShardSums. PostgreSQL sums integers as
    NUMERIC (Decimal): back to int."""
    counts = {str(ShardStatus(row.status)): row.num_shards for row in per_status}
    first_started = min((row.first_started for row in per_status if row.first_started is not None), default=None)
    worker_s = sum(float(row.run_s or 0.0) for row in per_status)
    done = next((row for row in per_status if row.status == ShardStatus.COMMITTED), None)
    if done is None:
        return ShardSums(shards=counts, first_started_at=first_started, worker_s=worker_s, window_s=window_s)
    return ShardSums(shards=counts, rows_succeeded=int(done.succeeded or 0), rows_failed=int(done.failed or 0),
                     rows_reused=int(done.reused or 0), num_tokens=int(done.tokens or 0),
                     recent_rows=int(done.recent_rows or 0), recent_tokens=int(done.recent_tokens or 0),
                     first_started_at=first_started, worker_s=worker_s, window_s=window_s)
