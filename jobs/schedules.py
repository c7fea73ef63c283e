"""Schedules: a cron expression in a time zone, a job template, a catch-up policy.

The decisions are pure functions of a schedule and a time, so they are table-tested:
which periods are due (`due_periods`), and what job a period gets (`render_spec`).
The beat (jobs.beat) applies them under the database's locks.

NOTE on time: a period is identified by its fire time as a UTC epoch; cron is
evaluated in the schedule's own time zone, so "0 2 * * *" in Europe/Paris fires at
02:00 Paris time across daylight-saving changes, and a template's `{date:%Y-%m-%d}`
is that local date.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadCronError, croniter

from jobs.spec import JobSpec, JobSpecError

CATCHUP = ("skip", "latest", "all")
"""What the beat does with periods that passed while nothing was running:
skip them (run only a period that is due now), run only the latest, or run them all."""
MISFIRE_GRACE_S = 300.0
"""A period is "due now", not missed, until this long after its fire time."""
TEMPLATED_FIELDS = ("input", "output")


class ScheduleError(ValueError):
    """A schedule Barge refuses; `field` names the culprit."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class Schedule:
    id: str
    name: str
    cron: str                  # five fields, evaluated in `timezone`
    timezone: str              # IANA name
    template: dict[str, Any]   # JobSpec fields; input/output may hold {date:...} and {prev_date:...}
    is_enabled: bool
    catchup: str               # one of CATCHUP
    retention_s: float | None  # outputs and cache entries older than this are pruned; None: kept
    next_run_at: float         # the first fire time not yet handled (UTC epoch)
    created_at: float = 0.0
    webhook_secret: str | None = None   # set only on the value `add` returns: shown once

    @classmethod
    def from_row(cls, row) -> "Schedule":
        return cls(id=row.id, name=row.name, cron=row.cron, timezone=row.timezone,
                   template=json.loads(row.template), is_enabled=bool(row.is_enabled), catchup=row.catchup,
                   retention_s=row.retention_s, next_run_at=row.next_run_at, created_at=row.created_at)


@dataclass(frozen=True)
class DuePeriods:
    run: list[float]          # fire times to create jobs for, oldest first
    skipped: list[float]      # missed fire times the policy leaves out
    next_run_at: float        # the new cursor: the first fire time after `now`


def check_schedule(name: str, cron: str, tz: str, catchup: str, retention_s: float | None,
                   template: dict[str, Any]) -> None:
    """Everything about a schedule that can be checked without its data; ScheduleError."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ScheduleError("name", f"must be a non-empty string of at most 200 characters, got {name!r}")
    zone(tz)
    if not isinstance(cron, str) or len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise ScheduleError("cron", f"{cron!r} is not a five-field cron expression (minute hour day month weekday)")
    if catchup not in CATCHUP:
        raise ScheduleError("catchup", f"{catchup!r} is not one of {', '.join(CATCHUP)}")
    if retention_s is not None and (isinstance(retention_s, bool) or not isinstance(retention_s, (int, float))
                                    or retention_s <= 0):
        raise ScheduleError("retention_s", f"must be a positive number of seconds or null, got {retention_s!r}")
    sample = next_fire_time(cron, tz, datetime.now(timezone.utc).timestamp())
    try:
        render_spec(template, cron, tz, sample, name)
    except JobSpecError as exc:
        raise ScheduleError(f"template.{exc.field}", exc.problem) from None


def zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError("timezone", f"{tz!r} is not an IANA time zone (e.g. UTC, Europe/Paris)") from None


def next_fire_time(cron: str, tz: str, after: float) -> float:
    """The first fire time strictly after `after` (UTC epochs). A wall time that occurs
    twice (the night clocks go back) fires at its first occurrence only, as cron does."""
    try:
        times = croniter(cron, datetime.fromtimestamp(after, zone(tz)))
        t = times.get_next(float)
        while _is_repeated_wall_time(t, zone(tz)):
            t = times.get_next(float)
        return t
    except CroniterBadCronError as exc:
        raise ScheduleError("cron", str(exc)) from None


def _is_repeated_wall_time(t: float, tz: ZoneInfo) -> bool:
    local = datetime.fromtimestamp(t, tz)
    return local.fold == 1 and local.utcoffset() != local.replace(fold=0).utcoffset()


def previous_fire_time(cron: str, tz: str, before: float) -> float:
    start = datetime.fromtimestamp(before, zone(tz))
    return croniter(cron, start).get_prev(float)


def due_periods(cron: str, tz: str, catchup: str, cursor: float, now: float,
                grace_s: float = MISFIRE_GRACE_S) -> DuePeriods:
    """The fire times in [cursor, now], split by the catch-up policy into those to run
    and those skipped; and the cursor after them."""
    due, t = [], cursor
    while t <= now:
        due.append(t)
        t = next_fire_time(cron, tz, t)
    if not due:
        return DuePeriods([], [], cursor)
    if catchup == "all":
        run = due
    elif catchup == "latest":
        run = due[-1:]
    else:   # skip: only a period due just now is not a missed one
        run = [p for p in due[-1:] if now - p <= grace_s]
    return DuePeriods(run=run, skipped=[p for p in due if p not in run], next_run_at=t)


def render_spec(template: dict[str, Any], cron: str, tz: str, period_at: float, name: str) -> JobSpec:
    """The job for one period: `{date:...}` in input/output is the period's local time,
    `{prev_date:...}` the fire time before it. Raises JobSpecError naming the field."""
    date = datetime.fromtimestamp(period_at, zone(tz))
    prev_date = datetime.fromtimestamp(previous_fire_time(cron, tz, period_at), zone(tz))
    fields = dict(template)
    for field_name in TEMPLATED_FIELDS:
        value = fields.get(field_name)
        try:
            if isinstance(value, str):
                fields[field_name] = value.format(date=date, prev_date=prev_date)
            elif isinstance(value, (list, tuple)):
                fields[field_name] = [v.format(date=date, prev_date=prev_date) if isinstance(v, str) else v
                                      for v in value]
        except (KeyError, IndexError, ValueError) as exc:
            raise JobSpecError(field_name, f"bad placeholder in {value!r}: {exc} "
                                           "(use {date:%Y-%m-%d} or {prev_date:%Y-%m-%d})") from None
    fields["metadata"] = {**dict(fields.get("metadata") or {}), "schedule": name,
                          "period": date.isoformat()}
    missing = [f.name for f in dataclasses.fields(JobSpec)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in fields]
    if missing:
        raise JobSpecError(missing[0], "missing: a template must give every required JobSpec field")
    return JobSpec.from_dict(fields)
