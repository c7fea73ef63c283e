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
from jobs.status import JobStatus
from jobs.unserved import unserved_jobs
from jobs.worker_beats import WorkerBeat, WorkerBeats, workers
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


def test_a_job_nobody_serves_that_asked_gets_one_signed_job_stalled_event(store):
    """job.stalled is written once per job, however many housekeepers look, only for a job
    that asked, and is delivered signed like any event; a retried job may stall again."""
    from jobs.unserved import notify_stalled
    from queueing.dispatch import deliver_event
    from tests.support.receiver import WebhookReceiver
    from webhooks.retry import RetryPolicy
    from webhooks.signing import verify

    with WebhookReceiver() as receiver:
        asked = new_job(store, webhook_url=receiver.url, webhook_events=["job.stalled"], metadata={"run": 7})
        silent = new_job(store, webhook_url=receiver.url)
        young = new_job(store, webhook_url=receiver.url, webhook_events=["job.stalled"])
        for job_id in (asked, silent):
            aged(store, job_id, 900)
        assert notify_stalled(store, after_s=300) == [asked]
        assert notify_stalled(store, after_s=300) == []          # a second housekeeper, or the next pass
        [event] = store.outbox.events(asked)
        assert event.type == "job.stalled"
        assert not store.outbox.events(silent) and not store.outbox.events(young)

        policy = RetryPolicy(base_s=0.05, cap_s=0.2, max_attempts=3, connect_timeout_s=1.0, read_timeout_s=2.0)
        assert deliver_event(store, event.id, policy, allow_hosts=("127.0.0.1",)) is True
        [(headers, body)] = receiver.wait_for(1)
        payload = verify(["whsec_test"], headers, body)
        assert payload["type"] == "job.stalled" and payload["data"]["job_id"] == asked
        assert payload["data"]["model"] == "all-MiniLM-L6-v2" and payload["data"]["last_served_at"] is None
        assert "no live worker serves model all-MiniLM-L6-v2" in payload["data"]["reason"]
        assert payload["data"]["metadata"] == {"run": 7}

        # A worker that starts serving the model: the job is no longer unserved, nothing more is sent.
        WorkerBeats(store.engine).beat(WorkerBeat(id="gpu-1:7", models=["all-MiniLM-L6-v2"],
                                                  started_at=time.time(), heartbeat_at=time.time()))
        aged(store, young, 900)
        assert notify_stalled(store, after_s=300) == []

        # Cancelled and retried, and the worker gone: its next stall is news again (and young's first).
        assert store.finish_job(asked, JobStatus.CANCELLED)
        store.retry_job(asked)
        with store.engine.begin() as conn:
            conn.execute(update(workers).values(heartbeat_at=time.time() - 3600))
        assert sorted(notify_stalled(store, after_s=300)) == sorted([asked, young])
        assert [e.type for e in store.outbox.events(asked)] == ["job.stalled", "job.stalled"]
