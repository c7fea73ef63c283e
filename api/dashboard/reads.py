"""What the dashboard's pages read from SQL, as plain dicts for the templates and the
JSON endpoints. Read-only: nothing here writes.

Ownership: a job belongs to the API key whose batch it runs (jobs.api_batches). A
viewer with a key sees only those jobs; the operator (an operator key or the login URL's
session: api.dashboard.access) sees every job, CLI and scheduled ones included. Schedules have no owner, so
only the operator sees them; a key sees the workers, but only its own jobs' shards on them.
"""

from __future__ import annotations

import time
from collections import Counter

from sqlalchemy import select

from api.dashboard.chart import Commit
from jobs import tables
from jobs.api_tables import api_batches, api_keys
from jobs.job_list import NO_SHARDS, JobList, ShardSums
from jobs.records import JobRecord
from jobs.status import JobStatus, ShardStatus
from jobs.store import Store
from jobs.throughput import measure
from storage.redaction import redact_text, redact_url, redact_value

MAX_JOBS = 200   # jobs per page of the list

_job, _shard, _batch, _key = tables.jobs.c, tables.shards.c, api_batches.c, api_keys.c
_run, _schedule = tables.schedule_runs.c, tables.schedules.c


class DashboardReads:
    def __init__(self, store: Store):
        self.store = store
        self.engine = store.engine
        self.listing = JobList(store.engine)

    # -- jobs ------------------------------------------------------------------------------

    def jobs(self, key_id: str | None, *, status: str | None = None, model: str | None = None,
             schedule: str | None = None, before: str | None = None, limit: int = MAX_JOBS) -> dict:
        """A page of the jobs the viewer may see, newest first, each with its progress and
        rates, and `next_before`: the cursor of the next, older page (None: the last).
        KeyError for a `before` the viewer may not see."""
        query = _jobs_query()
        if key_id is not None:
            query = query.where(_batch.key_id == key_id)
        if status:
            query = query.where(_job.status == int(JobStatus[status.upper()]))
        if model:
            query = query.where(_job.model_key == model)
        if schedule:
            query = query.where(_schedule.name == schedule)
        if before is not None and not self.can_see(key_id, before):
            raise KeyError(f"no job {before!r}")
        listed = self.listing.read(query, limit=limit, before=before)
        return {"jobs": [_job_summary(row, listed.sums.get(row.id, NO_SHARDS), listed.now) for row in listed.rows],
                "next_before": listed.next_before}

    def job_filters(self, key_id: str | None) -> dict:
        """The values the list's filters offer: statuses, models and schedules in use."""
        query = select(_job.model_key).distinct()
        if key_id is not None:
            query = query.join(api_batches, _batch.job_id == _job.id).where(_batch.key_id == key_id)
        with self.engine.connect() as conn:
            models = sorted(conn.execute(query).scalars())
            schedules = [] if key_id is not None else sorted(conn.execute(select(_schedule.name)).scalars())
        return {"statuses": [str(s) for s in JobStatus], "models": models, "schedules": schedules}

    def can_see(self, key_id: str | None, job_id: str) -> bool:
        if len(job_id) > 32 or not job_id.isalnum():
            return False
        query = select(_job.id).where(_job.id == job_id)
        if key_id is not None:
            query = query.join(api_batches, _batch.job_id == _job.id).where(_batch.key_id == key_id)
        with self.engine.connect() as conn:
            return conn.execute(query).first() is not None

    def job_summary(self, job_id: str) -> dict:
        """One job as the list shows it (the caller checked can_see)."""
        with self.engine.connect() as conn:
            row = conn.execute(_jobs_query().where(_job.id == job_id)).one()
            now = time.time()
            sums = self.listing.sum_shards(conn, [job_id], now)
        return _job_summary(row, sums.get(job_id, NO_SHARDS), now)

    def spec(self, job_id: str) -> dict:
        return redact_value(self.store.get_job(job_id).spec.to_dict())

    def commits(self, job_id: str) -> list[Commit]:
        query = (select(_shard.finished_at, _shard.rows_succeeded + _shard.rows_failed, _shard.num_tokens)
                 .where(_shard.job_id == job_id, _shard.status == int(ShardStatus.COMMITTED),
                        _shard.finished_at.is_not(None)).order_by(_shard.finished_at))
        with self.engine.connect() as conn:
            return [Commit(finished_at, int(rows or 0), int(tokens or 0)) for finished_at, rows, tokens in conn.execute(query)]

    def shards(self, job_id: str) -> list[dict]:
        query = select(tables.shards).where(_shard.job_id == job_id).order_by(_shard.shard_index)
        with self.engine.connect() as conn:
            return [_shard_view(row) for row in conn.execute(query)]

    def webhooks(self, job_id: str) -> list[dict]:
        events = []
        for event in self.store.outbox.events(job_id):
            events.append({"id": event.id, "type": event.type, "url": redact_url(event.url),
                           "status": event.status, "num_attempts": event.attempts,
                           "last_status_code": event.last_status_code, "last_error": redact_text(event.last_error),
                           "created_at": event.created_at, "delivered_at": event.delivered_at,
                           "attempts": [{"attempt": a.attempt, "started_at": a.started_at,
                                         "finished_at": a.finished_at, "status_code": a.status_code,
                                         "latency_s": a.latency_s, "error": redact_text(a.error),
                                         "ok": a.status_code is not None and 200 <= a.status_code < 300}
                                        for a in self.store.outbox.attempts(event.id)]})
        return events

def _jobs_query():
    """Jobs with their owner key (a batch's) and schedule, when they have one."""
    return (select(tables.jobs, _batch.key_id, _key.name.label("key_name"), _schedule.name.label("schedule"))
            .outerjoin(api_batches, _batch.job_id == _job.id).outerjoin(api_keys, _key.id == _batch.key_id)
            .outerjoin(tables.schedule_runs, _run.job_id == _job.id)
            .outerjoin(tables.schedules, _schedule.id == _run.schedule_id))


def _job_summary(row, sums: ShardSums, now: float) -> dict:
    job = JobRecord.from_row(row)
    rate = measure(sums.times(job, now), is_finished=job.status.is_finished)   # as `barge jobs` shows it
    return {"id": job.id, "status": str(job.status), "is_finished": job.status.is_finished,
            "model": job.spec.model if "/" not in job.spec.model else job.model_key, "model_key": job.model_key,
            "mode": job.spec.mode, "quantization": job.spec.quantization,
            "owner": row.key_id, "owner_name": row.key_name, "schedule": row.schedule,
            "rows_total": job.rows_total, "rows_done": sums.rows_done, "rows_failed": sums.rows_failed,
            "percent": round(100.0 * sums.rows_done / job.rows_total, 1) if job.rows_total else
            (100.0 if job.status == JobStatus.SUCCEEDED else 0.0),
            "num_tokens": sums.num_tokens, "rows_per_s": rate.recent_rows_per_s or rate.rows_per_s,
            "tokens_per_s": rate.recent_tokens_per_s or rate.tokens_per_s, "eta_s": rate.eta_s,
            "created_at": job.created_at, "age_s": max(0.0, now - job.created_at), "running_s": rate.running_s,
            "finished_at": job.finished_at, "end_at": job.finished_at or now, "error": redact_text(job.error)}


def _shard_view(row) -> dict:
    return {"index": row.shard_index, "status": str(ShardStatus(row.status)), "num_rows": row.num_rows,
            "attempt": row.attempt, "worker": row.worker_id, "lease_expires_at": row.lease_expires_at,
            "rows_succeeded": row.rows_succeeded, "rows_failed": row.rows_failed, "num_tokens": row.num_tokens,
            "started_at": row.started_at, "finished_at": row.finished_at, "error": redact_text(row.error)}


def shard_counts(shards: list[dict]) -> dict[str, int]:
    counts = Counter(shard["status"] for shard in shards)
    return {str(status): counts.get(str(status), 0) for status in ShardStatus}
