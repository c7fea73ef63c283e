"""The beat with a controllable clock, through a real client (SQLite, the embedded
broker): catch-up after an outage under each policy, refused periods, run-now, and a
beat that died mid-submission taken over without a second job."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import update

from jobs import tables
from jobs.beat import Beat, FileClock
from jobs.client import Client
from jobs.schedule_store import SUBMIT_LEASE_S
from jobs.settings import Settings
from jobs.spec import JobSpecError
from jobs.status import JobStatus

DAY = 86_400.0
T0 = datetime(2026, 12, 1, 12, tzinfo=timezone.utc).timestamp()
FIRST = T0 + 14 * 3600          # 02:00 UTC on 2 December: the first period


@dataclass
class FakeClock:
    t: float

    def now(self) -> float:
        return self.t


@pytest.fixture
def client(tmp_path):
    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")}))
    yield client
    client.store.engine.dispose()


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": ["a barge on the river", "a lock on the canal"]}), path)
    return path


def template(tmp_path, corpus, **changes):
    return {"mode": "embed", "model": "minilm", "input": str(corpus),
            "output": str(tmp_path / "out" / "{date:%Y-%m-%d}"), **changes}


def add(client, tmp_path, corpus, catchup, **changes):
    client.schedules.add("nightly", cron="0 2 * * *", template=template(tmp_path, corpus, **changes), catchup=catchup)
    # added "now" in real time: move its cursor to the simulated first period
    with client.store.engine.begin() as conn:
        conn.execute(update(tables.schedules).values(next_run_at=FIRST))
    return client.schedules.get("nightly")


def job_dates(client) -> list[str]:
    return sorted(state.output.rsplit("/", 1)[-1] for state in client.jobs(limit=100))


@pytest.mark.parametrize("catchup, expected", [
    ("skip", ["2026-12-02", "2026-12-06"]),                                    # the outage's periods dropped
    ("latest", ["2026-12-02", "2026-12-05", "2026-12-06"]),                    # only the last missed one
    ("all", ["2026-12-02", "2026-12-03", "2026-12-04", "2026-12-05", "2026-12-06"]),
])
def test_catch_up_after_an_outage_follows_the_policy(client, tmp_path, corpus, catchup, expected):
    add(client, tmp_path, corpus, catchup)
    clock = FakeClock(FIRST + 30)
    beat = Beat(client, clock)
    assert beat.tick().submitted == 1                   # 2 Dec, on time
    clock.t = FIRST + 3 * DAY + 6 * 3600                # back after an outage over 3, 4 and 5 Dec
    beat.tick()
    clock.t = FIRST + 4 * DAY + 10                      # 6 Dec, on time again
    beat.tick()
    beat.tick()                                          # a second tick in the same period adds nothing
    assert job_dates(client) == expected
    runs = client.schedules.runs("nightly")
    assert [r.status for r in runs] == ["submitted"] * len(expected)
    assert all(client.job(r.job_id).status().status == JobStatus.QUEUED for r in runs)


def test_a_period_whose_input_is_missing_is_refused_with_the_reason(client, tmp_path, corpus):
    add(client, tmp_path, corpus, "all", input=str(tmp_path / "daily" / "{date:%Y-%m-%d}.parquet"))
    (tmp_path / "daily").mkdir()
    pq.write_table(pa.table({"text": ["only this day"]}), tmp_path / "daily" / "2026-12-03.parquet")
    result = Beat(client, FakeClock(FIRST + DAY + 60)).tick()
    assert (result.submitted, result.refused) == (1, 1)
    first, second = client.schedules.runs("nightly")
    assert first.status == "refused" and "2026-12-02.parquet" in first.error and first.error.startswith("input:")
    assert second.status == "submitted"
    assert job_dates(client) == ["2026-12-03"]


def test_run_now_submits_a_job_besides_the_periods(client, tmp_path, corpus):
    add(client, tmp_path, corpus, "latest")
    job = client.schedules.run_now("nightly")
    [run] = client.schedules.runs("nightly")
    assert (run.kind, run.status, run.job_id) == ("manual", "submitted", job.id)
    assert job.status().status == JobStatus.QUEUED
    client.schedules.add("broken", cron="0 3 * * *", template=template(tmp_path, tmp_path / "nowhere.parquet"))
    with pytest.raises(JobSpecError, match="broken: input:"):
        client.schedules.run_now("broken")


def test_a_beat_that_died_mid_submission_is_taken_over_without_a_second_job(client, tmp_path, corpus):
    schedule = add(client, tmp_path, corpus, "all")
    # The first beat planned the period and created the job, then died before recording it.
    [run], _ = client.store.plan_due_runs(schedule.id, FIRST + 10)
    [claimed] = client.store.claim_pending_runs(FIRST + 10)
    from jobs.schedules import render_spec
    client.submit(render_spec(schedule.template, schedule.cron, schedule.timezone, run.period_at, "nightly"),
                  job_id=claimed.job_id)
    beat = Beat(client, FakeClock(FIRST + 20))
    assert beat.tick().submitted == 0                             # still held by the dead beat
    beat.clock.t = FIRST + 20 + SUBMIT_LEASE_S
    assert beat.tick().submitted == 1                             # taken over: recorded, not duplicated
    assert [s.job_id for s in client.jobs()] == [run.job_id]
    assert client.schedules.runs("nightly")[0].status == "submitted"


def test_file_clock_reads_the_simulated_time(tmp_path):
    path = tmp_path / "clock"
    path.write_text(f"{FIRST}\n")
    assert FileClock(path).now() == FIRST


def test_every_run_signs_its_webhooks_with_the_schedules_secret(client, tmp_path, corpus, monkeypatch):
    monkeypatch.setenv("BARGE_WEBHOOK_ALLOW_HOSTS", "127.0.0.1")
    schedule = client.schedules.add("hooked", cron="0 2 * * *", catchup="all",
                                    template=template(tmp_path, corpus, webhook_url="http://127.0.0.1:9/hook"))
    assert schedule.webhook_secret and schedule.webhook_secret.startswith("whsec_")
    assert client.schedules.get("hooked").webhook_secret is None        # shown once, never listed
    with client.store.engine.begin() as conn:
        conn.execute(update(tables.schedules).values(next_run_at=FIRST))
    Beat(client, FakeClock(FIRST + DAY + 10)).tick()
    runs = client.schedules.runs("hooked")
    assert len(runs) == 2
    assert all(client.store.webhook_secrets(r.job_id) == [schedule.webhook_secret] for r in runs)
