"""No dead ends: a job killed or starved at any step of its life still ends, exactly once.

For each named failpoint of the lifecycle (jobs.failpoints.POINTS), a small real job
runs through a real deployment, and the process at that point is either killed (then a
fresh worker is started) or starved of its database: on the embedded default the point
raises SQLite's OperationalError for a few seconds; on PostgreSQL the server itself is
stopped at that instant for about eight seconds and started again. Every run must end
with the job SUCCEEDED, every row exactly once, one manifest listing every shard,
_SUCCESS, and one final event delivered under one webhook-id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import JobSpec, JobStatus
from jobs.failpoints import POINTS
from jobs.transient import is_transient
from tests.e2e.test_job_e2e import write_corpus
from tests.support.receiver import WebhookReceiver
from tests.support.stack import stack

NUM_ROWS = 90
ROWS_PER_SHARD = 30
# Owners re-drive after 3 s, leases of a dead worker expire after 4 s.
FAST_RECOVERY = {"BARGE_REQUEUE_AFTER_S": "3", "BARGE_HOUSEKEEPING_S": "0.5", "BARGE_LEASE_S": "4"}
PG_VERSION = next(iter(os.listdir("/etc/postgresql")), "") if os.path.isdir("/etc/postgresql") else ""
PG_OUTAGE_S = 8.0

SUBMIT = """
import sys
from jobs import Client, JobSpec
Client().submit(JobSpec(mode="embed", model="minilm", input=sys.argv[1], id_column="doc_id",
                        output=sys.argv[2], max_rows_per_shard=int(sys.argv[3]), webhook_url=sys.argv[4]))
"""


def job_spec(tmp_path: Path, webhook_url: str) -> JobSpec:
    return JobSpec(mode="embed", model="minilm", input=str(tmp_path / "corpus"), id_column="doc_id",
                   output=str(tmp_path / "out"), max_rows_per_shard=ROWS_PER_SHARD, webhook_url=webhook_url)


def submit_in_subprocess(deployment, tmp_path: Path, webhook_url: str, failpoints: str) -> subprocess.Popen:
    """A client process with its own failpoints (the client's point is in Client.submit)."""
    env = {**os.environ, **deployment.env, "BARGE_FAILPOINTS": failpoints}
    return subprocess.Popen([sys.executable, "-c", SUBMIT, str(tmp_path / "corpus"), str(tmp_path / "out"),
                             str(ROWS_PER_SHARD), webhook_url], env=env)


def only_job_id(client, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = client.store.list_jobs()
        if jobs:
            assert len(jobs) == 1
            return jobs[0].id
        time.sleep(0.1)
    raise TimeoutError("the client recorded no job")


def wait_final(client, job_id: str, timeout_s: float = 180):
    """The job's final progress; database errors while it is down are waited out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = client.store.progress(job_id)
            if state.status.is_finished:
                return state
        except Exception as error:
            if not is_transient(error):
                raise
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} is not final after {timeout_s}s")


def assert_ended_exactly_once(client, job_id: str, tmp_path: Path, receiver: WebhookReceiver, logs) -> None:
    state = wait_final(client, job_id)
    assert state.status == JobStatus.SUCCEEDED, f"{state.error}\n{logs()}"
    table = client.job(job_id).results()
    assert sorted(table.column("doc_id").to_pylist()) == list(range(NUM_ROWS)), "every row exactly once"
    out = tmp_path / "out"
    manifest = json.loads((out / "_manifest.json").read_text())
    num_shards = len(client.store.list_shards(job_id))
    assert len(manifest["parts"]) == num_shards >= NUM_ROWS // ROWS_PER_SHARD
    assert sum(part["num_rows"] for part in manifest["parts"]) == NUM_ROWS
    assert (out / "_SUCCESS").exists()
    assert len(list(out.glob("part-*.parquet"))) == num_shards, "no stray part"
    deadline = time.monotonic() + 60
    while not final_event_ids(receiver) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)   # a second delivery, if one were coming, would be here by now
    assert len(final_event_ids(receiver)) == 1, f"one final event, under one webhook-id: {receiver.requests}"


def final_event_ids(receiver: WebhookReceiver) -> set[str]:
    return {headers["webhook-id"] for headers, body in list(receiver.requests)
            if json.loads(body)["type"] == "job.succeeded"}


CLIENT_POINT = "after_submit_record"   # in Client.submit; every other point is in a worker


def start_failing(deployment, tmp_path: Path, receiver: WebhookReceiver, point: str, action: str):
    """The process that carries the failpoint, with the job on its way: a client
    submitting it (CLIENT_POINT), or a worker serving it with the job submitted."""
    failpoints = f"{point}={action}"
    if point == CLIENT_POINT:
        return submit_in_subprocess(deployment, tmp_path, receiver.url, failpoints)
    worker = deployment.start_worker(env={"BARGE_FAILPOINTS": failpoints})
    deployment.client().submit(job_spec(tmp_path, receiver.url))
    return worker


def surviving_worker(deployment, failing, point: str):
    """The worker that carries the job on past the point: the failing process itself when
    it is a worker, else (the client is done submitting) a fresh one."""
    if point != CLIENT_POINT:
        return failing
    assert failing.wait(timeout=120) == 0
    return deployment.start_worker()


@pytest.mark.parametrize("point", POINTS)
def test_a_process_killed_at_each_point_leaves_no_dead_end(tmp_path, point):
    write_corpus(tmp_path / "corpus", num_files=1, rows_per_file=NUM_ROWS)
    with stack("embedded", tmp_path / "barge", env=FAST_RECOVERY) as deployment, WebhookReceiver() as receiver:
        failing = start_failing(deployment, tmp_path, receiver, point, "kill")
        assert failing.wait(timeout=120) == 137, deployment.worker_logs()
        deployment.start_worker()   # the restart, without the failpoint
        client = deployment.client()
        assert_ended_exactly_once(client, only_job_id(client), tmp_path, receiver, deployment.worker_logs)


@pytest.mark.parametrize("point", POINTS)
def test_a_database_error_at_each_point_is_waited_out(tmp_path, point):
    write_corpus(tmp_path / "corpus", num_files=1, rows_per_file=NUM_ROWS)
    with stack("embedded", tmp_path / "barge", env=FAST_RECOVERY) as deployment, WebhookReceiver() as receiver:
        failing = start_failing(deployment, tmp_path, receiver, point, "db_error:4")
        worker = surviving_worker(deployment, failing, point)
        client = deployment.client()
        assert_ended_exactly_once(client, only_job_id(client), tmp_path, receiver, deployment.worker_logs)
        assert worker.poll() is None, "the worker waited the outage out"


def postgres(action: str) -> None:
    """Stop or start the local cluster; "start" returns once it accepts connections (it
    may be running already: pg_ctlcluster then exits 2, which is fine)."""
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, "main", action]
    if action == "stop":
        subprocess.run([*command, "-m", "fast"], check=True, timeout=60)
        return
    subprocess.run(command, timeout=60)
    deadline = time.monotonic() + 60
    while subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"]).returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("PostgreSQL did not come back")
        time.sleep(0.2)


def postgres_outage_at(flag: Path, timeout_s: float = 120) -> None:
    """Once a process pauses at the point (jobs.failpoints' pause), stop PostgreSQL,
    let the process go on into the outage, and start the server again PG_OUTAGE_S later."""
    deadline = time.monotonic() + timeout_s
    while not flag.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing paused at {flag.name}")
        time.sleep(0.05)
    postgres("stop")
    try:
        flag.unlink()
        time.sleep(PG_OUTAGE_S)
    finally:
        postgres("start")


@pytest.mark.postgres
@pytest.mark.serial   # stops the machine's PostgreSQL: no other test may run meanwhile
@pytest.mark.skipif(not PG_VERSION or os.geteuid() != 0, reason="needs the local PostgreSQL cluster and root")
@pytest.mark.parametrize("point", POINTS)
def test_postgres_stopped_at_each_point_leaves_no_dead_end(tmp_path, point):
    write_corpus(tmp_path / "corpus", num_files=1, rows_per_file=NUM_ROWS)
    flag = tmp_path / f"{point}.paused"
    with stack("postgres-rabbitmq", tmp_path / "barge", env=FAST_RECOVERY) as deployment, \
            WebhookReceiver() as receiver:
        failing = start_failing(deployment, tmp_path, receiver, point, f"pause:{flag}")
        postgres_outage_at(flag)
        worker = surviving_worker(deployment, failing, point)
        client = deployment.client()
        assert_ended_exactly_once(client, only_job_id(client), tmp_path, receiver, deployment.worker_logs)
        assert worker.poll() is None, "the worker waited the outage out"
