"""Schedules from Python, as `client.schedules`:

    client.schedules.add("nightly-embed", cron="0 2 * * *", timezone="Europe/Paris",
                         template={"mode": "embed", "model": "minilm", "incremental": True,
                                   "input": "s3://corpus/{date:%Y-%m-%d}/*.parquet",
                                   "output": "s3://corpus-out/{date:%Y-%m-%d}/"},
                         catchup="latest", retention_s=30 * 86400)
    client.schedules.list() | .get(name) | .pause(name) | .resume(name) | .remove(name)
    client.schedules.run_now(name)      # a job now, besides the schedule's own periods
    client.schedules.runs(name)         # what each period got: a job, or why it was refused

`barge beat` fires them (jobs.beat); `barge schedule prune` applies retention.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Protocol

from sqlalchemy.exc import IntegrityError

from jobs.hosts import template_problem
from jobs.schedule_store import ScheduleRun
from jobs.schedules import Schedule, ScheduleError, check_schedule, render_spec
from jobs.settings import Settings
from jobs.spec import JobSpec, JobSpecError
from jobs.store import Store
from storage.redaction import redact_text
from webhooks.signing import generate_secret

log = logging.getLogger("barge.beat")


class JobClient(Protocol):
    """What schedules ask of the client that holds them: jobs.client.Client, which hands
    itself over as `client.schedules` (so this module does not import it back)."""

    store: Store
    settings: Settings

    def submit(self, spec: JobSpec, *, webhook_secret: str | None = None, job_id: str | None = None) -> Any:
        """Check, record and queue a job (Client.submit); returns its jobs.client.Job."""

    def plan(self, job_id: str) -> None:
        """Queue a QUEUED job's planning again."""

    def job(self, job_id: str) -> Any:
        """The jobs.client.Job of `job_id`; KeyError for an unknown id."""


class Schedules:
    def __init__(self, client: JobClient):
        self.client = client
        self.store = client.store

    def add(self, name: str, *, cron: str, template: dict[str, Any] | JobSpec, timezone: str = "UTC",
            catchup: str = "latest", retention_s: float | None = None,
            webhook_secret: str | None = None) -> Schedule:
        """Store an enabled schedule. `template` holds JobSpec fields; its input and output
        may contain {date:%Y-%m-%d} (the period, in `timezone`) and {prev_date:...}.
        With a webhook_url, every run's webhooks are signed with one secret: the given
        one, else a new one returned once as the result's `webhook_secret`.
        Raises ScheduleError naming a bad field, ValueError for a taken name."""
        if isinstance(template, JobSpec):
            template = template.to_dict()
        check_schedule(name, cron, timezone, catchup, retention_s, template)
        if (problem := template_problem(template, self.client.settings)) is not None:   # many hosts (jobs.hosts)
            raise ScheduleError(*problem)
        secret = (webhook_secret or generate_secret()) if template.get("webhook_url") else None
        schedule = self.store.add_schedule(name, cron, timezone, dict(template), catchup, retention_s,
                                           webhook_secret=secret)
        return dataclasses.replace(schedule, webhook_secret=secret)

    def get(self, name: str) -> Schedule:
        return self.store.get_schedule(name)

    def list(self) -> list[Schedule]:
        return self.store.list_schedules()

    def pause(self, name: str) -> Schedule:
        return self.store.set_schedule_enabled(name, False)

    def resume(self, name: str) -> Schedule:
        return self.store.set_schedule_enabled(name, True)

    def remove(self, name: str) -> None:
        self.store.remove_schedule(name)

    def runs(self, name: str) -> list[ScheduleRun]:
        return self.store.schedule_runs(self.get(name).id)

    def run_now(self, name: str) -> Any:
        """Submit the schedule's job for this moment and return its jobs.client.Job;
        JobSpecError if it is refused."""
        run = self.store.add_manual_run(name)
        status, error = submit_run(self.client, run)
        if status == "refused":
            raise JobSpecError("schedule", f"{name}: {error}")
        return self.client.job(run.job_id)

    def prune(self, name: str | None = None, *, dry_run: bool = False, now: float | None = None):
        """Apply retention (jobs.retention.prune) to one schedule or all; returns what
        was (or, with dry_run, would be) removed."""
        from jobs.cache_reach import CacheReach
        from jobs.retention import prune
        schedules = [self.get(name)] if name else self.list()
        return prune(self.store, schedules, CacheReach(self.client.settings), dry_run=dry_run, now=now)


def submit_run(client: JobClient, run: ScheduleRun) -> tuple[str, str | None]:
    """Create the run's job under its fixed id and record the outcome: ("submitted", None)
    or ("refused", why). A job that exists already was created by an earlier holder of
    the run: its planning is queued again (harmless) and the run is submitted."""
    store = client.store
    schedule = store.get_schedule_by_id(run.schedule_id)
    try:
        spec = render_spec(schedule.template, schedule.cron, schedule.timezone, run.period_at, schedule.name)
        client.submit(spec, job_id=run.job_id, webhook_secret=store.schedule_webhook_secret(schedule.id))
    except JobSpecError as exc:
        log.warning("schedule %s: run for %s refused: %s", schedule.name, run.period_at, redact_text(str(exc)))
        store.finish_run(run, "refused", str(exc))
        return "refused", str(exc)
    except IntegrityError:
        log.info("schedule %s: job %s exists already; queueing its planning again", schedule.name, run.job_id)
        client.plan(run.job_id)
    store.finish_run(run, "submitted")
    log.info("schedule %s: job %s submitted for %s", schedule.name, run.job_id, run.period_at)
    return "submitted", None
