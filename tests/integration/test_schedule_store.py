"""Schedules in SQL (SQLite and PostgreSQL): one run per schedule and period however
many beats plan at once, one claimer per pending run, pause/resume, removal."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy.exc import IntegrityError

from jobs.schedule_store import run_job_id
from tests.integration.test_store import make_spec, postgres_url, store, store_url  # noqa: F401 (fixtures)

TEMPLATE = {"mode": "embed", "model": "minilm", "input": "/in/{date:%Y-%m-%d}/", "output": "/out/{date:%Y-%m-%d}/"}
DAY = 86_400.0
T0 = datetime(2026, 12, 1, 12, tzinfo=timezone.utc).timestamp()   # noon; the schedule fires at 02:00 UTC


def add_daily(store, name="nightly", catchup="all"):
    return store.add_schedule(name, "0 2 * * *", "UTC", TEMPLATE, catchup, 7 * DAY, now=T0)


def test_many_beats_planning_at_once_create_one_run_per_period(store):
    schedule = add_daily(store)
    assert schedule.next_run_at == T0 + 14 * 3600   # 02:00 the next day
    now = T0 + 5 * DAY
    created, errors = [], []

    def beat():
        try:
            for step in range(6):   # several ticks each, racing the others
                runs, _ = store.plan_due_runs(schedule.id, now - (5 - step) * DAY)
                created.extend(runs)
        except Exception as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=beat) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    periods = sorted(run.period_at for run in created)
    assert periods == [T0 + 14 * 3600 + d * DAY for d in range(5)]
    assert [r.period_at for r in store.schedule_runs(schedule.id)] == periods
    assert store.get_schedule("nightly").next_run_at == T0 + 14 * 3600 + 5 * DAY


def test_a_pending_run_is_claimed_by_one_beat_until_its_lease_ends(store):
    schedule = add_daily(store)
    [run], _ = store.plan_due_runs(schedule.id, T0 + DAY)
    assert run.job_id == run_job_id(schedule.id, run.period_at)
    now = T0 + DAY
    assert [r.job_id for r in store.claim_pending_runs(now, lease_s=60)] == [run.job_id]
    assert store.claim_pending_runs(now + 30, lease_s=60) == []          # held
    [taken_over] = store.claim_pending_runs(now + 61, lease_s=60)         # its holder went silent
    store.finish_run(taken_over, "submitted")
    assert store.claim_pending_runs(now + 1000) == []
    assert store.schedule_runs(schedule.id)[0].status == "submitted"


def test_a_run_period_cannot_be_inserted_twice(store):
    """The primary key stands behind the lock: the same period never gets two runs."""
    from sqlalchemy import insert

    from jobs import tables
    schedule = add_daily(store)
    [run], _ = store.plan_due_runs(schedule.id, T0 + DAY)
    with pytest.raises(IntegrityError):
        with store.engine.begin() as conn:
            conn.execute(insert(tables.schedule_runs).values(
                schedule_id=schedule.id, period_at=run.period_at, kind="scheduled", job_id="x" * 32,
                status="pending", claimed_until=0.0, created_at=T0))


def test_the_fixed_job_id_makes_a_second_submission_fail(store):
    schedule = add_daily(store)
    [run], _ = store.plan_due_runs(schedule.id, T0 + DAY)
    store.create_job(make_spec(), model_key="minilm", rows_total=1, output_schema="s", webhook_secret=None,
                     job_id=run.job_id)
    with pytest.raises(IntegrityError):
        store.create_job(make_spec(), model_key="minilm", rows_total=1, output_schema="s", webhook_secret=None,
                         job_id=run.job_id)


def test_pause_stops_planning_and_resume_starts_from_the_next_period(store):
    schedule = add_daily(store)
    store.set_schedule_enabled("nightly", False, now=T0)
    assert store.plan_due_runs(schedule.id, T0 + 3 * DAY) == ([], [])
    assert store.enabled_schedule_ids() == []
    resumed = store.set_schedule_enabled("nightly", True, now=T0 + 3 * DAY)
    assert resumed.next_run_at == T0 + 14 * 3600 + 3 * DAY   # the paused periods are not caught up
    runs, _ = store.plan_due_runs(schedule.id, T0 + 3 * DAY + 14 * 3600)
    assert [r.period_at for r in runs] == [T0 + 14 * 3600 + 3 * DAY]


def test_names_are_unique_and_removal_takes_the_runs(store):
    schedule = add_daily(store)
    with pytest.raises(ValueError, match="exists already"):
        add_daily(store)
    store.plan_due_runs(schedule.id, T0 + 2 * DAY)
    store.remove_schedule("nightly")
    with pytest.raises(KeyError):
        store.get_schedule("nightly")
    assert store.schedule_runs(schedule.id) == []
