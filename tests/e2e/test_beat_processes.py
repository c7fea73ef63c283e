"""Two `barge beat` processes against PostgreSQL over simulated days (a clock file
both read): every period gets exactly one job, whichever beat wins each race."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import update

from jobs import tables
from tests.support.stack import stack

DAY = 86_400.0
FIRST = datetime(2026, 12, 2, 2, tzinfo=timezone.utc).timestamp()
NUM_DAYS = 8


def wait_for(condition, timeout_s: float, what: str, logs) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{logs()}")
        time.sleep(0.05)


@pytest.mark.postgres
@pytest.mark.redis
def test_two_beats_make_one_job_per_period(tmp_path):
    with stack("postgres-redis", tmp_path / "barge") as deployment:
        client = deployment.client()
        corpus = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"text": ["the nightly corpus"]}), corpus)
        client.schedules.add("nightly", cron="0 2 * * *", catchup="all", template={
            "mode": "embed", "model": "minilm", "input": str(corpus),
            "output": str(tmp_path / "out" / "{date:%Y-%m-%d}")})
        with client.store.engine.begin() as conn:   # start the schedule in simulated time
            conn.execute(update(tables.schedules).values(next_run_at=FIRST))
        clock = tmp_path / "clock"
        clock.write_text(str(FIRST - 3600))
        env = {**os.environ, **deployment.env, "BARGE_CLOCK_FILE": str(clock)}
        logs = [tmp_path / f"beat-{i}.log" for i in range(2)]
        beats = [subprocess.Popen([sys.executable, "-m", "cli", "beat", "--interval", "0.02"], env=env,
                                  stdout=open(log, "wb"), stderr=subprocess.STDOUT) for log in logs]
        read_logs = lambda: "\n".join(log.read_text()[-3000:] for log in logs)  # noqa: E731
        try:
            # Six-hour steps over the simulated days; both beats tick against every step.
            now = FIRST - 3600
            while now < FIRST + (NUM_DAYS - 1) * DAY + 3600:
                now += 6 * 3600
                clock.write_text(str(now))
                wait_for(lambda: client.schedules.get("nightly").next_run_at > now, 60, f"the cursor past {now}",
                         read_logs)
            wait_for(lambda: all(r.status == "submitted" for r in client.schedules.runs("nightly"))
                     and len(client.schedules.runs("nightly")) == NUM_DAYS, 120, "every run submitted", read_logs)
        finally:
            for beat in beats:
                beat.terminate()
            for beat in beats:
                beat.wait(timeout=15)
        runs = client.schedules.runs("nightly")
        assert [r.period_at for r in runs] == [FIRST + d * DAY for d in range(NUM_DAYS)]
        jobs = client.jobs(limit=100)
        assert sorted(j.job_id for j in jobs) == sorted(r.job_id for r in runs), "one job per period, no other"
        assert sorted(j.output.rsplit("/", 1)[-1] for j in jobs) == [f"2026-12-{d:02d}" for d in range(2, 2 + NUM_DAYS)]
        assert all(beat.returncode is not None for beat in beats)
