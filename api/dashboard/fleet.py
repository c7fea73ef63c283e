"""The workers page (heartbeats from jobs.worker_beats, current shards from the shards'
own leases) and the schedules page (next fire time, recent runs with the rows each
computed and reused).

A schedule's times are shown in its own zone, with their date and the zone's abbreviation
("2026-12-07 02:00:00 CET"): a nightly schedule's runs differ only by date, and an
abbreviation says which side of a clock change a time falls on.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from sqlalchemy import func, select

from jobs import tables
from jobs.api_tables import api_batches
from jobs.schedules import ScheduleError, zone
from jobs.status import JobStatus, ShardStatus
from jobs.store import Store
from jobs.worker_beats import WorkerBeats
from storage.redaction import redact_text, redact_value

STALE_BEAT_S = 30.0          # a worker whose last beat is older reads as "silent"
FORGET_AFTER_S = 86_400.0    # workers silent for longer are not listed
RECENT_RUNS = 10

_shard, _batch, _run = tables.shards.c, api_batches.c, tables.schedule_runs.c


def workers(store: Store, key_id: str | None) -> list[dict]:
    now = time.time()
    holding = _running_shards(store, key_id)
    found = []
    for beat in WorkerBeats(store.engine).list(since=now - FORGET_AFTER_S):
        age = now - beat.heartbeat_at
        state = "stopped" if beat.stopped_at else ("alive" if age <= STALE_BEAT_S else "silent")
        if any(engine.stall for engine in beat.engines):
            state = "stalled"   # it exited because an engine made no progress (queueing.stall)
        found.append({"id": beat.id, "state": state, "models": beat.models, "heartbeat_age_s": age,
                      "heartbeat_at": beat.heartbeat_at, "started_at": beat.started_at,
                      "engines": [redact_value(engine.__dict__) for engine in beat.engines],
                      "shards": holding.get(beat.id, [])})
    return found


def _running_shards(store: Store, key_id: str | None) -> dict[str, list[dict]]:
    """worker id -> the shards it holds now (RUNNING, lease not expired); a key's viewer
    is shown only its own jobs' shards."""
    query = (select(_shard.worker_id, _shard.job_id, _shard.shard_index, _shard.attempt, _shard.lease_expires_at)
             .where(_shard.status == int(ShardStatus.RUNNING), _shard.lease_expires_at >= time.time()))
    if key_id is not None:
        query = query.join(api_batches, _batch.job_id == _shard.job_id).where(_batch.key_id == key_id)
    holding: dict[str, list[dict]] = {}
    with store.engine.connect() as conn:
        for worker_id, job_id, index, attempt, lease in conn.execute(query):
            holding.setdefault(worker_id, []).append({"job_id": job_id, "index": index, "attempt": attempt,
                                                      "lease_expires_at": lease})
    return holding


def schedules(store: Store) -> list[dict]:
    found = []
    for schedule in store.list_schedules():
        runs = store.schedule_runs(schedule.id)[-RECENT_RUNS:][::-1]
        rows = _rows_by_job(store, [run.job_id for run in runs])
        found.append({"name": schedule.name, "cron": schedule.cron, "timezone": schedule.timezone,
                      "is_enabled": schedule.is_enabled, "catchup": schedule.catchup,
                      "next_run_at": schedule.next_run_at, "next_run": zoned(schedule.next_run_at, schedule.timezone),
                      "template": redact_value(schedule.template),
                      "runs": [{"period_at": run.period_at, "period": zoned(run.period_at, schedule.timezone),
                                "kind": run.kind, "job_id": run.job_id,
                                "status": run.status, "error": redact_text(run.error), "pruned": run.pruned_at is not None,
                                **rows.get(run.job_id, {"rows_computed": 0, "rows_reused": 0, "job_status": None})}
                               for run in runs]})
    return found


def zoned(t: float | None, tz: str) -> dict | None:
    """A UTC epoch in zone `tz`: {"text": "2026-12-07 02:00:00 CET", "iso": "2026-12-07T02:00:00+01:00"}.
    A zone this machine's tz database lacks (the schedule was added elsewhere) reads in UTC."""
    if t is None:
        return None
    try:
        local = datetime.fromtimestamp(t, zone(tz))
    except ScheduleError:
        local = datetime.fromtimestamp(t, timezone.utc)
    return {"text": local.strftime("%Y-%m-%d %H:%M:%S %Z"), "iso": local.isoformat()}


def _rows_by_job(store: Store, job_ids: list[str]) -> dict[str, dict]:
    if not job_ids:
        return {}
    committed = _shard.status == int(ShardStatus.COMMITTED)
    query = (select(_shard.job_id, func.sum(_shard.rows_succeeded + _shard.rows_failed).filter(committed),
                    func.sum(_shard.rows_reused).filter(committed))
             .where(_shard.job_id.in_(job_ids)).group_by(_shard.job_id))
    statuses = select(tables.jobs.c.id, tables.jobs.c.status).where(tables.jobs.c.id.in_(job_ids))
    with store.engine.connect() as conn:
        sums = {job_id: (int(done or 0), int(reused or 0)) for job_id, done, reused in conn.execute(query)}
        status = {job_id: s for job_id, s in conn.execute(statuses)}
    found = {}
    for job_id, job_status in status.items():
        done, reused = sums.get(job_id, (0, 0))
        found[job_id] = {"rows_computed": done - reused, "rows_reused": reused, "job_status": str(JobStatus(job_status))}
    return found
