"""Crash safety and scheduling with real brokers and real worker processes: a worker
killed mid-shard, shards outliving a broker's visibility timeout, SIGTERM drain,
cancellation mid-shard, a partial manifest whose task was lost, priorities, fair
sharing, dead-lettering a poisoned shard, retrying a failed job, two workers sharing one job."""

from __future__ import annotations

import json
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sqlalchemy import update

from jobs import JobSpec, JobStatus, ShardStatus, tables
from jobs.client import JobFailed
from tests.support.receiver import WebhookReceiver
from tests.support.stack import backend_params, stack, wait_until

# A worker killed between taking a shard's message and claiming the shard loses the
# message (it was acknowledged on start); the housekeeper sends such a shard again after
# BARGE_REQUEUE_AFTER_S, shortened here as the leases are.
FAST_RECOVERY = {"BARGE_LEASE_S": "3", "BARGE_HOUSEKEEPING_S": "0.5", "BARGE_CHUNK_ROWS": "64",
                 "BARGE_REQUEUE_AFTER_S": "10"}


def write_corpus(folder, num_rows: int, rows_per_file: int, poison_row: int | None = None) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, num_rows, rows_per_file):
        ids = list(range(start, min(start + rows_per_file, num_rows)))
        texts = ["POISON" if i == poison_row else f"Row {i} of a corpus about barges and the rivers they sail on."
                 for i in ids]
        pq.write_table(pa.table({"doc_id": pa.array(ids, pa.int64()), "text": texts}),
                       folder / f"part-{start:06d}.parquet", row_group_size=100)
    return num_rows


def submit(client, tmp_path, name: str, *, corpus, rows_per_shard: int, **fields):
    return client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), id_column="doc_id",
                                 output=str(tmp_path / f"out-{name}"), max_rows_per_shard=rows_per_shard, **fields))


def running_shard(client, job):
    return next((s for s in client.store.list_shards(job.id) if s.status == ShardStatus.RUNNING), None)


def assert_every_row_once(job, num_rows: int, output):
    ids = job.results().column("doc_id").to_pylist()
    assert sorted(ids) == list(range(num_rows))
    manifest = json.loads((output / "_manifest.json").read_text())
    assert sum(part["num_rows"] for part in manifest["parts"]) == num_rows
    assert len({part["name"] for part in manifest["parts"]}) == len(manifest["parts"])


@pytest.mark.parametrize("backend", backend_params("embedded", "postgres-rabbitmq", "postgres-redis"))
def test_a_worker_killed_mid_shard_loses_nothing(backend, tmp_path):
    with stack(backend, tmp_path / "barge", FAST_RECOVERY) as deployment:
        num_rows = write_corpus(tmp_path / "corpus", 1200, 400)
        first = deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "killed", corpus=tmp_path / "corpus", rows_per_shard=400)
        wait_until(lambda: running_shard(client, job), what="a running shard")
        first.send_signal(signal.SIGKILL)
        first.wait()
        deployment.start_worker()
        state = job.wait(timeout=240)
        assert state.status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert_every_row_once(job, num_rows, tmp_path / "out-killed")
        shards = client.store.list_shards(job.id)
        assert any(s.attempt == 2 for s in shards), "the killed worker's shard ran again"
        assert all(s.status == ShardStatus.COMMITTED for s in shards)


@pytest.mark.postgres
@pytest.mark.redis
def test_shards_longer_than_the_visibility_timeout_run_once(tmp_path):
    # a lease of 15 s, not FAST_RECOVERY's 3: no shard may run twice here, and on a loaded
    # machine (make test) a worker's heartbeat went 3 s unscheduled and lost its lease
    env = {**FAST_RECOVERY, "BARGE_LEASE_S": "15", "BARGE_VISIBILITY_TIMEOUT_S": "1"}
    with stack("postgres-redis", tmp_path / "barge", env) as deployment:
        num_rows = write_corpus(tmp_path / "corpus", 1200, 600)
        deployment.start_worker()
        deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "long", corpus=tmp_path / "corpus", rows_per_shard=600)
        assert job.wait(timeout=240).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        shards = client.store.list_shards(job.id)
        assert [s.attempt for s in shards] == [1, 1], "no shard was run a second time"
        assert min(s.finished_at - s.started_at for s in shards) > 1, "each shard outlived the timeout"
        assert_every_row_once(job, num_rows, tmp_path / "out-long")


def test_sigterm_past_the_grace_period_releases_the_shard(tmp_path):
    with stack("embedded", tmp_path / "barge", {**FAST_RECOVERY, "BARGE_DRAIN_GRACE_S": "0.2"}) as deployment:
        num_rows = write_corpus(tmp_path / "corpus", 1500, 1500)
        first = deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "drain", corpus=tmp_path / "corpus", rows_per_shard=1500)
        wait_until(lambda: running_shard(client, job), what="a running shard")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0, "the worker drained and exited cleanly"
        shard = client.store.list_shards(job.id)[0]
        assert (shard.status, shard.attempt) == (ShardStatus.PENDING, 1), "released, not lost"
        second = deployment.start_worker()
        assert job.wait(timeout=240).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        shard = client.store.list_shards(job.id)[0]
        assert shard.attempt == 2 and shard.worker_id.endswith(f":{second.pid}")
        assert_every_row_once(job, num_rows, tmp_path / "out-drain")


def test_sigterm_within_the_grace_period_finishes_the_shard(tmp_path):
    with stack("embedded", tmp_path / "barge", {**FAST_RECOVERY, "BARGE_DRAIN_GRACE_S": "120"}) as deployment:
        write_corpus(tmp_path / "corpus", 800, 400)
        first = deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "finish", corpus=tmp_path / "corpus", rows_per_shard=400)
        shard = wait_until(lambda: running_shard(client, job), what="a running shard")
        signalled_at = time.time()
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 0
        shards = {s.shard_index: s for s in client.store.list_shards(job.id)}
        assert shards[shard.shard_index].status == ShardStatus.COMMITTED
        assert shards[shard.shard_index].worker_id.endswith(f":{first.pid}")
        # The pipeline may have claimed the next shard before the signal (read ahead): it
        # finishes that too. It claims nothing after it.
        held = [s for s in shards.values() if s.started_at is not None]
        assert all(s.started_at <= signalled_at for s in held), "it took no new shard"
        assert all(s.status == ShardStatus.COMMITTED for s in held), "what it held, it finished"


def test_cancel_stops_a_running_shard_within_seconds(tmp_path):
    with stack("embedded", tmp_path / "barge", FAST_RECOVERY) as deployment:
        write_corpus(tmp_path / "corpus", 3000, 3000)
        worker = deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "cancel", corpus=tmp_path / "corpus", rows_per_shard=3000)
        wait_until(lambda: running_shard(client, job), what="a running shard")
        assert job.cancel()
        cancelled_at = time.monotonic()
        wait_until(lambda: b"the claim is gone" in worker.log_path.read_bytes(), timeout_s=20,
                   what="the worker to stop the shard")
        assert time.monotonic() - cancelled_at < 10
        shard = client.store.list_shards(job.id)[0]
        assert shard.status == ShardStatus.CANCELLED and shard.part is None
        assert job.status().status == JobStatus.CANCELLED
        assert not (tmp_path / "out-cancel" / "_SUCCESS").exists()
        # Its manifest lists what it finished: nothing, its one shard was stopped.
        wait_until(lambda: (tmp_path / "out-cancel" / "_manifest.json").exists(), timeout_s=30,
                   what="the partial manifest")
        assert json.loads((tmp_path / "out-cancel" / "_manifest.json").read_text())["status"] == "cancelled"
        assert job.results(partial=True).num_rows == 0


def test_a_cancelled_jobs_webhook_arrives_after_its_partial_manifest(tmp_path):
    # The worker is inside one long engine call when the cancel lands, so the task that
    # writes the manifest waits its turn (the pool is solo) while the dispatcher thread,
    # polling often here, is free to deliver: the final event must wait for the manifest.
    manifest = tmp_path / "out-hooked" / "_manifest.json"
    arrivals = []   # (event type, whether the manifest was there when it arrived)
    receiver = WebhookReceiver(on_request=lambda body: arrivals.append((json.loads(body)["type"], manifest.exists())))
    env = {**FAST_RECOVERY, "BARGE_CHUNK_ROWS": "3000", "BARGE_DISPATCH_INTERVAL_S": "0.2"}
    with receiver, stack("embedded", tmp_path / "barge", env) as deployment:
        write_corpus(tmp_path / "corpus", 9000, 3000)
        deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "hooked", corpus=tmp_path / "corpus", rows_per_shard=3000,
                     webhook_url=receiver.url)
        wait_until(lambda: committed_shards(client, job), what="a committed shard")
        assert job.cancel()
        wait_until(lambda: arrivals, timeout_s=60, what=f"the final webhook:\n{deployment.worker_logs()}")
    assert arrivals == [("job.cancelled", True)]
    assert json.loads(manifest.read_text())["status"] == "cancelled"


def test_a_job_past_its_deadline_expires_with_what_it_finished(tmp_path):
    with stack("embedded", tmp_path / "barge", FAST_RECOVERY) as deployment:
        num_rows = write_corpus(tmp_path / "corpus", 2000, 200)
        deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "expire", corpus=tmp_path / "corpus", rows_per_shard=200,
                     expires_after_s=3600)
        wait_until(lambda: committed_shards(client, job), what="a committed shard")
        with client.store.engine.begin() as conn:   # the deadline passes now, not in an hour
            conn.execute(update(tables.jobs).where(tables.jobs.c.id == job.id).values(expires_at=time.time()))
        state = job.wait(timeout=30)
        assert state.status == JobStatus.EXPIRED and "expires_after_s=3600" in state.error
        output = tmp_path / "out-expire"
        wait_until(lambda: (output / "_manifest.json").exists(), timeout_s=30, what="the partial manifest")

        committed = assert_partial_output(client, job, output, "expired", rows_per_shard=200)
        with pytest.raises(JobFailed, match="partial=True"):
            job.results()

        retried = client.retry(job)   # the rest, once; the committed shards stay as they are
        assert retried.wait(timeout=180).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert_every_row_once(retried, num_rows, output)
        assert all(client.store.list_shards(job.id)[s.shard_index].attempt == s.attempt for s in committed)


def test_a_partial_manifest_whose_task_was_lost_is_written_by_a_housekeeper(tmp_path):
    # Cancelling records the final state, then sends the task that lists what the job
    # finished. A client killed between the two (or a broker down at that moment) leaves
    # the manifest owed; a worker's housekeeper sends the task again after BARGE_REQUEUE_AFTER_S.
    with stack("embedded", tmp_path / "barge", FAST_RECOVERY) as deployment:
        write_corpus(tmp_path / "corpus", 2000, 200)
        worker = deployment.start_worker()
        client = deployment.client()
        job = submit(client, tmp_path, "lost", corpus=tmp_path / "corpus", rows_per_shard=200)
        wait_until(lambda: committed_shards(client, job), what="a committed shard")
        assert client.store.finish_job(job.id, JobStatus.CANCELLED)   # the cancel, and no send after it
        output = tmp_path / "out-lost"
        wait_until(lambda: (output / "_manifest.json").exists(), timeout_s=60, what="the owed manifest")
        assert b"its partial manifest was owed" in worker.log_path.read_bytes()

        assert_partial_output(client, job, output, "cancelled", rows_per_shard=200)
        wait_until(lambda: client.store.stale_partial_outputs(0) == [], timeout_s=10, what="the debt cleared")


def committed_shards(client, job):
    return [s for s in client.store.list_shards(job.id) if s.status == ShardStatus.COMMITTED]


def assert_partial_output(client, job, output, status: str, rows_per_shard: int):
    """The job ended `status` part-way; its manifest (no _SUCCESS) lists exactly its
    committed shards, whose rows results(partial=True) reads. Returns those shards."""
    committed = committed_shards(client, job)
    assert 0 < len(committed) < len(client.store.list_shards(job.id)), f"it was {status} part-way"
    manifest = json.loads((output / "_manifest.json").read_text())
    assert manifest["status"] == status and not (output / "_SUCCESS").exists()
    assert [part["name"] for part in manifest["parts"]] == [s.part["name"] for s in committed]
    ids = job.results(partial=True).column("doc_id").to_pylist()
    assert sorted(ids) == sorted(i for s in committed
                                 for i in range(rows_per_shard * s.shard_index, rows_per_shard * (s.shard_index + 1)))
    return committed


@pytest.mark.parametrize("backend", backend_params("postgres-rabbitmq", "postgres-redis"))
def test_a_high_priority_job_runs_before_a_low_one_queued_earlier(backend, tmp_path):
    with stack(backend, tmp_path / "barge", {**FAST_RECOVERY, "BARGE_JOB_WINDOW": "8"}) as deployment:
        write_corpus(tmp_path / "nightly", 600, 600)
        write_corpus(tmp_path / "interactive", 300, 300)
        client = deployment.client()
        nightly = submit(client, tmp_path, "nightly", corpus=tmp_path / "nightly", rows_per_shard=100, priority=1)
        interactive = submit(client, tmp_path, "interactive", corpus=tmp_path / "interactive",
                             rows_per_shard=100, priority=9)
        deployment.start_worker()
        assert interactive.wait(timeout=240).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert nightly.wait(timeout=240).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        high = [s.started_at for s in client.store.list_shards(interactive.id)]
        low = sorted(s.started_at for s in client.store.list_shards(nightly.id))
        # The worker may plan the nightly job and start (and prefetch) a shard or two of
        # it before it plans the interactive one; from then on the interactive shards go
        # first. First in, first out would run all six nightly shards first.
        assert max(high) < low[3], (high, low)


def test_a_small_job_is_not_stuck_behind_a_huge_one(tmp_path):
    with stack("embedded", tmp_path / "barge", {**FAST_RECOVERY, "BARGE_JOB_WINDOW": "1"}) as deployment:
        write_corpus(tmp_path / "huge", 800, 800)
        write_corpus(tmp_path / "small", 100, 100)
        client = deployment.client()
        huge = submit(client, tmp_path, "huge", corpus=tmp_path / "huge", rows_per_shard=100)
        small = submit(client, tmp_path, "small", corpus=tmp_path / "small", rows_per_shard=100)
        deployment.start_worker()
        assert small.wait(timeout=240).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert huge.wait(timeout=240).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        small_done = client.store.list_shards(small.id)[0].finished_at
        huge_started = sorted(s.started_at for s in client.store.list_shards(huge.id))
        assert small_done < huge_started[3], "the small job ran among the huge job's first shards"


def test_two_workers_share_one_job(tmp_path):
    with stack("embedded", tmp_path / "barge", FAST_RECOVERY) as deployment:
        num_rows = write_corpus(tmp_path / "corpus", 1200, 200)
        workers = [deployment.start_worker(), deployment.start_worker()]
        client = deployment.client()
        job = submit(client, tmp_path, "shared", corpus=tmp_path / "corpus", rows_per_shard=200)
        assert job.wait(timeout=240).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        holders = {s.worker_id.rsplit(":", 1)[1] for s in client.store.list_shards(job.id)}
        assert holders == {str(w.pid) for w in workers}
        assert_every_row_once(job, num_rows, tmp_path / "out-shared")


def test_a_poisoned_shard_is_dead_lettered_and_a_retry_finishes_the_job(tmp_path):
    env = {**FAST_RECOVERY, "BARGE_LEASE_S": "2", "BARGE_MAX_ATTEMPTS": "2"}
    with stack("embedded", tmp_path / "barge", env) as deployment:
        num_rows = write_corpus(tmp_path / "corpus", 400, 100, poison_row=250)
        client = deployment.client()
        job = submit(client, tmp_path, "poison", corpus=tmp_path / "corpus", rows_per_shard=100)
        poisoned = {"BARGE_FAILPOINTS": "crash_on_input=POISON"}
        for _ in range(6):   # a supervisor restarting the worker each time it dies
            worker = deployment.start_worker(env=poisoned)
            while worker.poll() is None and not job.status().is_finished:
                time.sleep(0.2)
            if job.status().is_finished:
                break
            assert worker.returncode == 137
        state = job.wait(timeout=60)
        assert state.status == JobStatus.FAILED and "dead-lettered after 2 attempts" in state.error
        shards = client.store.list_shards(job.id)
        assert [s.status for s in shards].count(ShardStatus.FAILED) == 1
        assert [s.status for s in shards].count(ShardStatus.COMMITTED) == 3
        wait_until(lambda: (tmp_path / "out-poison" / "_manifest.json").exists(), what="the partial manifest")
        assert job.results(partial=True).num_rows == 300   # the three shards it committed

        deployment.stop_workers()
        deployment.start_worker()   # the poison is gone (the row was fixed, say)
        retried = client.retry(job)
        assert retried.wait(timeout=120).status == JobStatus.SUCCEEDED, deployment.worker_logs()
        assert_every_row_once(retried, num_rows, tmp_path / "out-poison")
