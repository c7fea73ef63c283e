"""Schedules and their runs in SQL.

NOTE: exactly one job per schedule and period, however many beat processes run. A
beat plans a schedule's due periods in one transaction that locks the schedule's row,
inserts a run per period and advances the cursor: a second beat waits on the lock and
then finds the cursor moved. Behind the lock stand two keys: a run's primary key is
(schedule, period), and its job id is fixed when the run is inserted, so submitting
it twice (a beat that died mid-submission, taken over by another) hits the jobs
table's primary key instead of creating a second job.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass

from sqlalchemy import delete, insert, select, update

from jobs import tables
from jobs.schedules import Schedule, due_periods, next_fire_time
from jobs.secret_box import SecretBox

SUBMIT_LEASE_S = 120.0   # a beat submitting a run holds it this long; then another may take over


@dataclass(frozen=True)
class ScheduleRun:
    schedule_id: str
    period_at: float          # fire time (UTC epoch); a manual run's is when it was asked for
    kind: str                 # scheduled | manual
    job_id: str
    status: str               # pending | submitted | refused
    error: str | None
    created_at: float
    pruned_at: float | None = None

    @classmethod
    def from_row(cls, row) -> "ScheduleRun":
        return cls(schedule_id=row.schedule_id, period_at=row.period_at, kind=row.kind, job_id=row.job_id,
                   status=row.status, error=row.error, created_at=row.created_at, pruned_at=row.pruned_at)


def run_job_id(schedule_id: str, period_at: float) -> str:
    return hashlib.sha256(f"{schedule_id}:{period_at!r}".encode()).hexdigest()[:32]


class ScheduleStore:
    engine: object
    secrets: SecretBox   # supplied by jobs.store.Store

    def add_schedule(self, name: str, cron: str, tz: str, template: dict, catchup: str,
                     retention_s: float | None, now: float | None = None, webhook_secret: str | None = None) -> Schedule:
        """Insert an enabled schedule whose first period is the first fire time after now.
        ValueError if the name is taken."""
        now = time.time() if now is None else now
        if self._schedule_row(name) is not None:
            raise ValueError(f"a schedule named {name!r} exists already")
        values = dict(id=uuid.uuid4().hex, name=name, cron=cron, timezone=tz, template=json.dumps(template),
                      is_enabled=True, catchup=catchup, retention_s=retention_s,
                      webhook_secret=self.secrets.encrypt(webhook_secret),
                      next_run_at=next_fire_time(cron, tz, now), created_at=now, updated_at=now)
        with self.engine.begin() as conn:
            conn.execute(insert(tables.schedules).values(**values))
        return self.get_schedule(name)

    def get_schedule(self, name: str) -> Schedule:
        row = self._schedule_row(name)
        if row is None:
            raise KeyError(f"no schedule named {name!r}")
        return Schedule.from_row(row)

    def schedule_webhook_secret(self, schedule_id: str) -> str | None:
        s = tables.schedules.c
        with self.engine.connect() as conn:
            stored = conn.execute(select(s.webhook_secret).where(s.id == schedule_id)).scalar_one_or_none()
        return self.secrets.decrypt(stored)

    def get_schedule_by_id(self, schedule_id: str) -> Schedule:
        with self.engine.connect() as conn:
            return Schedule.from_row(conn.execute(
                select(tables.schedules).where(tables.schedules.c.id == schedule_id)).one())

    def list_schedules(self) -> list[Schedule]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(tables.schedules).order_by(tables.schedules.c.name)).all()
        return [Schedule.from_row(row) for row in rows]

    def set_schedule_enabled(self, name: str, is_enabled: bool, now: float | None = None) -> Schedule:
        """Pause or resume. Resuming starts from the next fire time: periods that passed
        while paused were paused on purpose, and are not caught up."""
        now = time.time() if now is None else now
        schedule = self.get_schedule(name)
        values = dict(is_enabled=is_enabled, updated_at=now)
        if is_enabled and not schedule.is_enabled:
            values["next_run_at"] = next_fire_time(schedule.cron, schedule.timezone, now)
        with self.engine.begin() as conn:
            conn.execute(update(tables.schedules).where(tables.schedules.c.id == schedule.id).values(**values))
        return self.get_schedule(name)

    def remove_schedule(self, name: str) -> None:
        """Delete the schedule and its run records; its jobs and outputs stay."""
        schedule = self.get_schedule(name)
        with self.engine.begin() as conn:
            conn.execute(delete(tables.schedule_runs).where(tables.schedule_runs.c.schedule_id == schedule.id))
            conn.execute(delete(tables.schedules).where(tables.schedules.c.id == schedule.id))

    def plan_due_runs(self, schedule_id: str, now: float) -> tuple[list[ScheduleRun], list[float]]:
        """Insert a pending run for each due period (catch-up policy applied) and advance
        the cursor, under the schedule's row lock. Returns (runs created, periods skipped)."""
        s = tables.schedules.c
        with self.engine.begin() as conn:
            row = conn.execute(select(tables.schedules).where(s.id == schedule_id).with_for_update()).one_or_none()
            if row is None or not row.is_enabled or row.next_run_at > now:
                return [], []
            due = due_periods(row.cron, row.timezone, row.catchup, row.next_run_at, now)
            runs = [dict(schedule_id=schedule_id, period_at=period, kind="scheduled",
                         job_id=run_job_id(schedule_id, period), status="pending", error=None,
                         claimed_until=0.0, created_at=now) for period in due.run]
            if runs:
                conn.execute(insert(tables.schedule_runs), runs)
            conn.execute(update(tables.schedules).where(s.id == schedule_id)
                         .values(next_run_at=due.next_run_at, updated_at=now))
        return [ScheduleRun.from_row(_Row(run)) for run in runs], due.skipped

    def add_manual_run(self, name: str, now: float | None = None) -> ScheduleRun:
        """A run asked for now (run-now), held by the caller, who submits it."""
        now = time.time() if now is None else now
        schedule = self.get_schedule(name)
        run = dict(schedule_id=schedule.id, period_at=now, kind="manual", job_id=run_job_id(schedule.id, now),
                   status="pending", error=None, claimed_until=now + SUBMIT_LEASE_S, created_at=now)
        with self.engine.begin() as conn:
            conn.execute(insert(tables.schedule_runs).values(**run))
        return ScheduleRun.from_row(_Row(run))

    def claim_pending_runs(self, now: float, lease_s: float = SUBMIT_LEASE_S) -> list[ScheduleRun]:
        """Pending runs no live beat is submitting, each now held by the caller."""
        r = tables.schedule_runs.c
        with self.engine.connect() as conn:
            candidates = conn.execute(select(r.schedule_id, r.period_at).where(
                r.status == "pending", r.claimed_until < now).order_by(r.period_at)).all()
        claimed = []
        for schedule_id, period_at in candidates:
            with self.engine.begin() as conn:   # compare-and-set: one claimer wins
                won = conn.execute(update(tables.schedule_runs).where(
                    r.schedule_id == schedule_id, r.period_at == period_at, r.status == "pending",
                    r.claimed_until < now).values(claimed_until=now + lease_s)).rowcount
                if won:
                    claimed.append(ScheduleRun.from_row(conn.execute(select(tables.schedule_runs).where(
                        r.schedule_id == schedule_id, r.period_at == period_at)).one()))
        return claimed

    def finish_run(self, run: ScheduleRun, status: str, error: str | None = None) -> None:
        r = tables.schedule_runs.c
        with self.engine.begin() as conn:
            conn.execute(update(tables.schedule_runs).where(
                r.schedule_id == run.schedule_id, r.period_at == run.period_at).values(status=status, error=error))

    def schedule_runs(self, schedule_id: str) -> list[ScheduleRun]:
        r = tables.schedule_runs.c
        with self.engine.connect() as conn:
            rows = conn.execute(select(tables.schedule_runs).where(r.schedule_id == schedule_id)
                                .order_by(r.period_at)).all()
        return [ScheduleRun.from_row(row) for row in rows]

    def mark_run_pruned(self, run: ScheduleRun, now: float) -> None:
        r = tables.schedule_runs.c
        with self.engine.begin() as conn:
            conn.execute(update(tables.schedule_runs).where(
                r.schedule_id == run.schedule_id, r.period_at == run.period_at).values(pruned_at=now))

    def enabled_schedule_ids(self) -> list[str]:
        s = tables.schedules.c
        with self.engine.connect() as conn:
            return list(conn.execute(select(s.id).where(s.is_enabled.is_(True))).scalars())

    def _schedule_row(self, name: str):
        with self.engine.connect() as conn:
            return conn.execute(select(tables.schedules).where(tables.schedules.c.name == name)).one_or_none()


class _Row:
    """A dict seen as a row, so runs built here and read back share from_row."""

    def __init__(self, values: dict):
        self.__dict__.update(values, pruned_at=values.get("pruned_at"))
