"""A job whose model no worker serves says so (issue 46, jobs.unserved): after
BARGE_UNSERVED_AFTER_S without a heartbeat listing its model, `barge status`, the
dashboard's job page and `barge_jobs_unserved` name the model and how long ago it was last
served; a job whose model a live worker lists, or a young job, says nothing. SQLite and
PostgreSQL, through the real CLI and app."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import update

from api.app import create_app
from jobs import tables
from jobs.api_keys import ApiKeys
from jobs.client import Client
from jobs.settings import Settings
from jobs.unserved import unserved_jobs
from jobs.worker_beats import WorkerBeat, WorkerBeats
from tests.integration.test_store import new_job, postgres_url, store, store_url  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[2]


def aged(store, job_id: str, seconds: float) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(tables.jobs).where(tables.jobs.c.id == job_id).values(created_at=time.time() - seconds))


def test_a_job_nobody_serves_says_so_where_an_operator_looks(store, tmp_path):
    now = time.time()
    served, orphan, young = new_job(store), new_job(store, model="nobody-has-this"), new_job(store)
    with store.engine.begin() as conn:   # as submit records a model nobody registered on the workers
        conn.execute(update(tables.jobs).where(tables.jobs.c.id == orphan).values(model_key="nobody-has-this"))
    for job_id in (served, orphan):
        aged(store, job_id, 900)
    WorkerBeats(store.engine).beat(WorkerBeat(id="gpu-1:7", models=["all-MiniLM-L6-v2"], started_at=now - 60,
                                              heartbeat_at=now))
    found = unserved_jobs(store.engine, after_s=300)
    assert [u.job_id for u in found] == [orphan] and found[0].last_served_at is None
    assert "no worker has ever served it" in found[0].describe()
    assert young not in {u.job_id for u in unserved_jobs(store.engine, after_s=300)}

    # A worker that served the model and went away 20 minutes ago: said with its age.
    WorkerBeats(store.engine).beat(WorkerBeat(id="gpu-2:8", models=["nobody-has-this"], started_at=now - 3600,
                                              heartbeat_at=now - 1200, stopped_at=now - 1200))
    [gone] = unserved_jobs(store.engine, after_s=300)
    assert "beat 1200 s ago" in gone.describe(now)

    env = {**os.environ, "BARGE_DATABASE_URL": store.url, "BARGE_DATA_DIR": str(tmp_path / "data")}
    status = subprocess.run([sys.executable, "-m", "cli", "status", orphan], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert "waiting: no live worker serves model nobody-has-this" in status.stdout, status.stdout + status.stderr
    status = subprocess.run([sys.executable, "-m", "cli", "status", served], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert "waiting" not in status.stdout

    client = Client(settings=Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "data"), "BARGE_DATABASE_URL": store.url}))
    operator = ApiKeys(store.engine).create("ops", operator=True).secret
    http = TestClient(create_app(client), base_url="http://localhost", headers={"Authorization": f"Bearer {operator}"})
    page = http.get(f"/dashboard/jobs/{orphan}").text
    assert 'id="unserved"' in page and "nobody-has-this" in page
    assert 'id="unserved"' not in http.get(f"/dashboard/jobs/{served}").text

    from prometheus_client import generate_latest

    from queueing.metrics import WorkerMetrics
    metrics = WorkerMetrics(unserved_jobs=lambda: len(unserved_jobs(store.engine, after_s=300)))
    assert "barge_jobs_unserved 1.0" in generate_latest(metrics.registry).decode()
