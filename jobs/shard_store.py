"""Shards in SQL: claims under leases, commits fenced by attempt tokens, the
fair-share window of shards sent to the broker, and dead-lettering.

NOTE: the broker is only a hint. A message for a shard says "this shard may need
running"; whether it does is decided here, under the job's row lock:
- a shard RUNNING under a live lease belongs to its worker: a redelivered message for
  it (a broker's visibility or consumer timeout, a duplicate) is dropped;
- a worker renews its lease while it works; when a lease expires (the worker died or
  hung) `reclaim_expired` hands the shard back, and after `max_attempts` losses or
  failures the shard is dead-lettered (FAILED with its last error);
- a commit carries the attempt's token, so a stale attempt can never overwrite or
  double a newer one's rows.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import Connection, func, select, update

from jobs import tables
from jobs.generate_usage import GenerateUsage
from jobs.outbox import OutboxEvent, insert_event
from jobs.records import ShardRecord
from jobs.status import JobStatus, ShardStatus, check_transition

DEFAULT_LEASE_S = 60.0
DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class ShardClaim:
    token: str        # fencing token: only this attempt may commit the shard
    attempt: int
    plan: dict


@dataclass(frozen=True)
class ShardCommitted:
    """A shard commit as seen inside its transaction (the job row locked), so the
    counts are exact even while other shards of the job commit concurrently."""

    job_id: str
    shard_index: int
    rows_succeeded: int       # this shard's
    rows_failed: int
    part_name: str
    shards_total: int
    shards_finished: int      # committed or failed, this one included
    job_rows_succeeded: int   # over the job's committed shards, this one included
    job_rows_failed: int


# Builds the opt-in webhook events of one commit (jobs.events.shard_events).
ShardEvents = Callable[[ShardCommitted], list[OutboxEvent]]


@dataclass(frozen=True)
class Reclaimed:
    """A shard whose lease expired, as `reclaim_expired` left it."""

    job_id: str
    shard_index: int
    status: ShardStatus       # PENDING (to send again) or FAILED (dead-lettered)
    job_is_ready: bool        # this dead-letter finished the job's last shard


class ShardStore:
    """The shard half of `jobs.store.Store` (which supplies `engine` and `_job_transaction`)."""

    def list_shards(self, job_id: str) -> list[ShardRecord]:
        query = select(tables.shards).where(tables.shards.c.job_id == job_id).order_by(tables.shards.c.shard_index)
        with self.engine.connect() as conn:
            return [ShardRecord.from_row(row) for row in conn.execute(query)]

    def generate_usages(self, job_id: str) -> list[GenerateUsage]:
        """What the job's committed shards recorded of their prefill and adapters, in shard
        order; a shard of another mode, or committed before migration 0020, recorded none."""
        shard = tables.shards.c
        query = (select(shard.generate_usage).where(shard.job_id == job_id, shard.status == int(ShardStatus.COMMITTED),
                                                    shard.generate_usage.is_not(None)).order_by(shard.shard_index))
        with self.engine.connect() as conn:
            return [GenerateUsage.from_dict(json.loads(text)) for text in conn.execute(query).scalars()]

    def claim_shard(self, job_id: str, shard_index: int, *, worker_id: str = "",
                    lease_s: float = DEFAULT_LEASE_S) -> ShardClaim | None:
        """Take the shard under a new attempt token and lease; None if it is finished,
        its job is not running, or a live worker holds it."""
        now = time.time()
        with self._job_transaction(job_id) as (conn, job):
            if JobStatus(job.status) != JobStatus.RUNNING:
                return None
            shard = self._shard_row(conn, job_id, shard_index)
            status = ShardStatus(shard.status)
            if status.is_finished or (status == ShardStatus.RUNNING and (shard.lease_expires_at or 0) > now):
                return None
            check_transition(status, ShardStatus.RUNNING)
            token = uuid.uuid4().hex
            self._update_shard(conn, job_id, shard_index, status=int(ShardStatus.RUNNING), token=token,
                               attempt=shard.attempt + 1, started_at=now, worker_id=worker_id,
                               lease_expires_at=now + lease_s, error=None)
            return ShardClaim(token=token, attempt=shard.attempt + 1, plan=json.loads(shard.plan))

    def renew_lease(self, job_id: str, shard_index: int, token: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
        """Extend the attempt's lease; False if the attempt no longer holds the shard
        (the job was cancelled or expired, or the lease was reclaimed): stop working."""
        shard = tables.shards.c
        with self.engine.begin() as conn:
            renewed = conn.execute(update(tables.shards).where(
                shard.job_id == job_id, shard.shard_index == shard_index, shard.token == token,
                shard.status == int(ShardStatus.RUNNING)).values(lease_expires_at=time.time() + lease_s)).rowcount
        return renewed == 1

    def commit_shard(self, job_id: str, shard_index: int, token: str, *, part: dict,
                     rows_succeeded: int, rows_failed: int, events: ShardEvents | None = None,
                     num_tokens: int = 0, engine: dict | None = None, rows_reused: int = 0,
                     generate_usage: GenerateUsage | None = None) -> tuple[bool, bool]:
        """Record the shard's part under its attempt token, and the webhook events that
        `events` builds for it, in one transaction. `num_tokens` and `engine` (its
        settings, "device" among them) feed throughput and the job report; `rows_reused`
        counts the succeeded rows an incremental job took from the results cache;
        `generate_usage` is a generate shard's prefill and rows per adapter.

        Returns (committed, job_is_ready): committed is False for a stale token (another
        attempt took the shard over); job_is_ready is True for exactly the commit that
        finished the job's last shard."""
        return self._finish_shard(job_id, shard_index, token, ShardStatus.COMMITTED, events=events,
                                  part=json.dumps(part), rows_succeeded=rows_succeeded, rows_failed=rows_failed,
                                  num_tokens=num_tokens, rows_reused=rows_reused, device=(engine or {}).get("device"),
                                  engine=json.dumps(engine, sort_keys=True) if engine else None,
                                  generate_usage=json.dumps(generate_usage.to_dict()) if generate_usage else None)

    def fail_shard(self, job_id: str, shard_index: int, token: str, error: str) -> tuple[bool, bool]:
        return self._finish_shard(job_id, shard_index, token, ShardStatus.FAILED, error=error)

    def release_shard(self, job_id: str, shard_index: int, token: str, error: str | None, *,
                      counts_as_attempt: bool = True) -> bool:
        """Give a running shard back for another attempt (a retryable failure, or a
        worker draining). The caller sends it to the broker again. An attempt that met
        an outage (jobs.transient) is given back uncounted, so no number of outages
        dead-letters a shard."""
        with self._job_transaction(job_id) as (conn, _job):
            shard = self._shard_row(conn, job_id, shard_index)
            if shard.token != token or ShardStatus(shard.status) != ShardStatus.RUNNING:
                return False
            attempt = shard.attempt if counts_as_attempt else max(shard.attempt - 1, 0)
            self._update_shard(conn, job_id, shard_index, status=int(ShardStatus.PENDING), token=None,
                               error=error, lease_expires_at=None, queued_at=time.time(), attempt=attempt)
        return True

    def reclaim_expired(self, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS, now: float | None = None) -> list[Reclaimed]:
        """Hand back every RUNNING shard whose lease has expired; dead-letter those lost
        or failed `max_attempts` times."""
        now = time.time() if now is None else now
        shard = tables.shards.c
        with self.engine.connect() as conn:
            expired = conn.execute(select(shard.job_id, shard.shard_index).where(
                shard.status == int(ShardStatus.RUNNING), shard.lease_expires_at < now)).all()
        reclaimed = []
        for job_id, shard_index in expired:
            outcome = self._reclaim_one(job_id, shard_index, max_attempts, now)
            if outcome is not None:
                reclaimed.append(outcome)
        return reclaimed

    def _reclaim_one(self, job_id: str, shard_index: int, max_attempts: int, now: float) -> Reclaimed | None:
        with self._job_transaction(job_id) as (conn, job):
            row = self._shard_row(conn, job_id, shard_index)
            if ShardStatus(row.status) != ShardStatus.RUNNING or (row.lease_expires_at or 0) >= now:
                return None   # renewed or finished since the scan
            lost = f"lease expired on attempt {row.attempt} (worker {row.worker_id or '?'} lost)"
            if row.attempt < max_attempts:
                self._update_shard(conn, job_id, shard_index, status=int(ShardStatus.PENDING), token=None,
                                   lease_expires_at=None, queued_at=now, error=lost)
                return Reclaimed(job_id, shard_index, ShardStatus.PENDING, job_is_ready=False)
            error = f"dead-lettered after {row.attempt} attempts: {lost}"
            self._update_shard(conn, job_id, shard_index, status=int(ShardStatus.FAILED), token=None,
                               lease_expires_at=None, finished_at=now, error=error)
            is_ready = JobStatus(job.status) == JobStatus.RUNNING and self._num_unfinished(conn, job_id) == 0
            return Reclaimed(job_id, shard_index, ShardStatus.FAILED, job_is_ready=is_ready)

    def take_unsent(self, job_id: str, limit: int) -> list[int]:
        """Mark up to `limit` of the job's never-sent PENDING shards as sent and return
        them, in plan order: the fair-share window keeps each job's share of the broker
        queue small, so a job submitted later is not stuck behind a huge one."""
        shard = tables.shards.c
        with self._job_transaction(job_id) as (conn, job):
            if JobStatus(job.status) != JobStatus.RUNNING or limit <= 0:
                return []
            indices = list(conn.execute(select(shard.shard_index).where(
                shard.job_id == job_id, shard.status == int(ShardStatus.PENDING), shard.queued_at.is_(None))
                .order_by(shard.shard_index).limit(limit)).scalars())
            if indices:
                conn.execute(update(tables.shards).where(shard.job_id == job_id, shard.shard_index.in_(indices))
                             .values(queued_at=time.time()))
        return indices

    def num_in_flight(self, job_id: str) -> int:
        """Shards sent to the broker and not finished: queued PENDING plus RUNNING."""
        shard = tables.shards.c
        with self.engine.connect() as conn:
            return conn.execute(select(func.count()).where(
                shard.job_id == job_id, shard.status.in_([int(ShardStatus.PENDING), int(ShardStatus.RUNNING)]),
                (shard.queued_at.is_not(None)) | (shard.status == int(ShardStatus.RUNNING)))).scalar_one()

    def stale_queued(self, older_than_s: float, now: float | None = None) -> list[tuple[str, int]]:
        """PENDING shards sent long ago that no worker has claimed: their message may be
        lost (a broker restart without persistence); sending again is harmless, since
        claiming drops duplicates."""
        now = time.time() if now is None else now
        shard, job = tables.shards.c, tables.jobs.c
        query = (select(shard.job_id, shard.shard_index).join(tables.jobs, job.id == shard.job_id)
                 .where(job.status == int(JobStatus.RUNNING), shard.status == int(ShardStatus.PENDING),
                        shard.queued_at < now - older_than_s))
        with self.engine.connect() as conn:
            return [(j, i) for j, i in conn.execute(query).all()]

    def shard_counts_by_model(self) -> dict[tuple[str, str], int]:
        """(model key, "pending" | "running") -> shards of RUNNING jobs (worker metrics)."""
        shard, job = tables.shards.c, tables.jobs.c
        query = (select(job.model_key, shard.status, func.count()).join(tables.jobs, job.id == shard.job_id)
                 .where(job.status == int(JobStatus.RUNNING),
                        shard.status.in_([int(ShardStatus.PENDING), int(ShardStatus.RUNNING)]))
                 .group_by(job.model_key, shard.status))
        with self.engine.connect() as conn:
            return {(model, "running" if status == int(ShardStatus.RUNNING) else "pending"): count
                    for model, status, count in conn.execute(query).all()}

    def running_job_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(tables.jobs.c.id).where(
                tables.jobs.c.status == int(JobStatus.RUNNING))).scalars())

    def touch_queued(self, job_id: str, shard_index: int) -> None:
        self._update_shard_now(job_id, shard_index, queued_at=time.time())

    def _update_shard_now(self, job_id: str, shard_index: int, **values) -> None:
        with self.engine.begin() as conn:
            self._update_shard(conn, job_id, shard_index, **values)

    def _finish_shard(self, job_id: str, shard_index: int, token: str, target: ShardStatus,
                      events: ShardEvents | None = None, **values) -> tuple[bool, bool]:
        with self._job_transaction(job_id) as (conn, job):
            shard = self._shard_row(conn, job_id, shard_index)
            if shard.token != token or ShardStatus(shard.status) != ShardStatus.RUNNING:
                return False, False
            check_transition(ShardStatus(shard.status), target)
            now = time.time()
            self._update_shard(conn, job_id, shard_index, status=int(target), finished_at=now,
                               lease_expires_at=None, **values)
            if events is not None:
                for event in events(self._shard_committed(conn, job_id, shard_index)):
                    insert_event(conn, job_id, event, now)
            is_ready = JobStatus(job.status) == JobStatus.RUNNING and self._num_unfinished(conn, job_id) == 0
        return True, is_ready

    def _shard_committed(self, conn: Connection, job_id: str, shard_index: int) -> ShardCommitted:
        shard = tables.shards.c
        finished = [int(s) for s in ShardStatus if s.is_finished and s != ShardStatus.CANCELLED]
        counts = conn.execute(select(
            func.count(), func.count().filter(shard.status.in_(finished)),
            func.sum(shard.rows_succeeded).filter(shard.status == int(ShardStatus.COMMITTED)),
            func.sum(shard.rows_failed).filter(shard.status == int(ShardStatus.COMMITTED)),
        ).where(shard.job_id == job_id)).one()
        row = self._shard_row(conn, job_id, shard_index)
        return ShardCommitted(job_id=job_id, shard_index=shard_index, rows_succeeded=row.rows_succeeded,
                              rows_failed=row.rows_failed, part_name=json.loads(row.part)["name"],
                              shards_total=counts[0], shards_finished=counts[1],
                              job_rows_succeeded=counts[2] or 0, job_rows_failed=counts[3] or 0)

    def _shard_row(self, conn: Connection, job_id: str, shard_index: int):
        shard = tables.shards.c
        row = conn.execute(select(tables.shards).where(shard.job_id == job_id, shard.shard_index == shard_index)).one_or_none()
        if row is None:
            raise KeyError(f"no shard {shard_index} in job {job_id!r}")
        return row

    def _update_shard(self, conn: Connection, job_id: str, shard_index: int, **values) -> None:
        shard = tables.shards.c
        conn.execute(update(tables.shards).where(shard.job_id == job_id, shard.shard_index == shard_index)
                     .values(updated_at=time.time(), **values))

    def _num_unfinished(self, conn: Connection, job_id: str) -> int:
        shard = tables.shards.c
        unfinished = [int(s) for s in ShardStatus if not s.is_finished]
        return conn.execute(select(func.count()).where(shard.job_id == job_id, shard.status.in_(unfinished))).scalar_one()
