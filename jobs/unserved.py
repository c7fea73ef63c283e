"""Jobs whose model nobody serves: said, not sat on (issue 46).

A job's shards go to its model's queue; a queue no worker consumes — a model registered on
no worker, a worker that never came up, or went away — left the job `running`, 0 rows, its
shards pending, with nothing logged anywhere. The workers' heartbeats (jobs.worker_beats)
say which models are served: a job with work to do whose model no live worker has
listed for `after_s` (BARGE_UNSERVED_AFTER_S, 300 s) is unserved, and `barge status`, the
dashboard's job page and the metric `barge_jobs_unserved` say so, and a job that asked for
`job.stalled` (JobSpec.webhook_events) gets that event once (`notify_stalled`, from every
worker's housekeeper: the first to see the job marks it and writes the event in one
transaction, so a fleet sends it once). Nothing is re-driven: there is nobody to drive it to.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from typing import TYPE_CHECKING

from sqlalchemy import Engine, select, update

from jobs import tables
from jobs.hub_models import queue_key
from jobs.outbox import OutboxEvent, insert_event
from jobs.status import JobStatus
from jobs.worker_beats import WorkerBeats
from webhooks.events import stalled_event

if TYPE_CHECKING:
    from jobs.store import Store

UNSERVED_AFTER_S = 300.0


@dataclass(frozen=True)
class Unserved:
    job_id: str
    model_key: str
    last_served_at: float | None    # the last beat of a worker that listed the model; None: never seen

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        seen = ("no worker has ever served it" if self.last_served_at is None
                else f"the last worker serving it beat {now - self.last_served_at:.0f} s ago")
        return (f"waiting: no live worker serves model {self.model_key} ({seen}); start one with "
                f"`barge worker --model ...` on a host that has it")


def unserved_after_s(env: dict[str, str] | None = None) -> float:
    env = os.environ if env is None else env
    return float(env.get("BARGE_UNSERVED_AFTER_S") or UNSERVED_AFTER_S)


def unserved_jobs(engine: Engine, after_s: float | None = None, now: float | None = None,
                  job_ids: list[str] | None = None) -> list[Unserved]:
    """Queued or running jobs older than `after_s` whose model no worker has listed in a
    heartbeat for `after_s` (a model's last sighting is the newest beat, or clean stop, of
    any worker that listed it; rows older than 30 days are not read)."""
    now = time.time() if now is None else now
    after_s = unserved_after_s() if after_s is None else after_s
    last_seen: dict[str, float] = {}
    for beat in WorkerBeats(engine).list(since=now - 30 * 86_400):
        served_until = beat.stopped_at or beat.heartbeat_at
        for model in beat.models:
            key = queue_key(model)
            last_seen[key] = max(last_seen.get(key, 0.0), served_until)
    job = tables.jobs.c
    query = select(job.id, job.model_key).where(job.status.in_([int(JobStatus.QUEUED), int(JobStatus.RUNNING)]),
                                                job.created_at < now - after_s)
    if job_ids is not None:
        query = query.where(job.id.in_(job_ids))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    found = []
    for job_id, model_key in rows:
        seen = last_seen.get(queue_key(model_key))
        if seen is None or now - seen > after_s:   # a worker silent for less may yet come back
            found.append(Unserved(job_id, model_key, seen))
    return found


def notify_stalled(store: Store, after_s: float | None = None, now: float | None = None) -> list[str]:
    """Write the job.stalled event of each unserved job that asked for it and has not had
    it; returns their ids. The mark and the event commit together, and the mark is set
    only where it was unset, so two housekeepers at once write one event."""
    now = time.time() if now is None else now
    job = tables.jobs.c
    notified = []
    for unserved in unserved_jobs(store.engine, after_s, now):
        record = store.get_job(unserved.job_id)
        spec = record.spec
        if "job.stalled" not in spec.webhook_events or not spec.webhook_url:
            continue
        event = stalled_event(job_id=record.id, status=str(record.status), model=unserved.model_key,
                              last_served_at=unserved.last_served_at, reason=unserved.describe(now),
                              metadata=spec.metadata)
        with store.engine.begin() as conn:
            marked = conn.execute(update(tables.jobs).where(job.id == record.id, job.stalled_notified_at.is_(None))
                                  .values(stalled_notified_at=now))
            if marked.rowcount != 1:
                continue
            insert_event(conn, record.id, OutboxEvent(id=event.event_id, type=event.type, url=spec.webhook_url,
                                                      body=event.body()), now)
        notified.append(record.id)
    return notified
