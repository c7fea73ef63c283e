"""The chaos soak: several jobs over an S3 corpus on a real deployment (PostgreSQL and
RabbitMQ or Redis, worker processes, a moto S3 server behind the fault proxy, a webhook
receiver), while a seeded schedule of faults hits every part at once. bench/chaos_soak.py
runs the full soak, tests/e2e/test_chaos_soak.py a short one; both end with
tests.support.soak_checks.

    config → corpus on S3 → workers → submit jobs → faults play while the jobs run
           → faults end, services up → deliveries settle → checks and figures
"""

from __future__ import annotations

import itertools
import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support import services
from tests.support.chaos_schedule import FULL, FaultProfile, plan_faults
from tests.support.fault_injector import FaultInjector
from tests.support.flaky_receiver import FlakyReceiver
from tests.support.soak_checks import SoakJob, SoakReport, check_soak
from tests.support.worker_pool import WorkerPool

MODEL_NAME = "soak-bert"
BUCKET = "soak"
# Recovery shortened from production's minutes to seconds, so the soak's faults are
# recovered from within its run; the mechanisms are the same. Webhook retries come every
# few seconds instead of hours apart, so they get more attempts: production's 36 span
# about three days, and here too they must outlast the receiver's longest outage.
WORKER_ENV = {
    "BARGE_LEASE_S": "10", "BARGE_HOUSEKEEPING_S": "1", "BARGE_REQUEUE_AFTER_S": "30",
    "BARGE_TRANSIENT_RETRY_S": "60", "BARGE_DRAIN_GRACE_S": "5", "BARGE_MAX_ATTEMPTS": "10",
    "BARGE_WEBHOOK_RETRY_BASE_S": "1", "BARGE_WEBHOOK_RETRY_CAP_S": "15", "BARGE_WEBHOOK_TIMEOUT_S": "3",
    "BARGE_WEBHOOK_MAX_ATTEMPTS": "1000",
    "BARGE_WEBHOOK_CONNECT_TIMEOUT_S": "2", "BARGE_DISPATCH_INTERVAL_S": "0.5", "BARGE_JOB_WINDOW": "8",
}


@dataclass(frozen=True)
class SoakConfig:
    seed: int = 1
    broker: str = "rabbitmq"          # rabbitmq | redis
    num_rows: int = 120_000
    num_files: int = 120              # the corpus: num_rows over this many Parquet files
    rows_per_group: int = 500         # Parquet row groups; shards follow them
    rows_per_shard: int = 500
    num_workers: int = 3
    profile: FaultProfile = FULL
    deadline_s: float = 1200.0        # expires_after_s of the job that has a tight deadline
    timeout_s: float = 3600.0         # the jobs must all be final by then
    settle_s: float = 180.0           # after the faults: time for the last webhooks to arrive
    worker_env: dict[str, str] = field(default_factory=lambda: dict(WORKER_ENV))


def run_soak(config: SoakConfig, work_dir: Path, log=print) -> SoakReport:
    """Run one soak; every service it stopped is running again when it returns or raises."""
    from tests.integration.s3server import S3Server
    from tests.support.faulty_proxy import FaultyProxy
    from tests.support.stack import stack

    with ExitStack() as cleanup:
        cleanup.callback(services.ensure_up)   # last: whatever else failed, the services are up
        s3 = cleanup.enter_context(S3Server())
        proxy = cleanup.enter_context(FaultyProxy(s3.endpoint_url))
        receiver = cleanup.enter_context(FlakyReceiver())
        model_folder = _save_model(work_dir / "model")
        env = {**config.worker_env, **_s3_env(proxy.endpoint_url), "BARGE_MODELS": f"{MODEL_NAME}={model_folder}"}
        # The soak's own client checks jobs against S3 straight, not through the faults,
        # which are the workers' to meet. (Put back as it was at the end: a test session goes on.)
        cleanup.callback(_restore_environ, dict(os.environ))
        os.environ.update({**_s3_env(s3.endpoint_url), "BARGE_MODELS": env["BARGE_MODELS"]})
        backend = "postgres-rabbitmq" if config.broker == "rabbitmq" else "postgres-redis"
        for service in ("postgres", config.broker):   # another test on this machine may be restarting one
            services.wait_listening(service)
        deployment = cleanup.enter_context(stack(backend, work_dir / "barge", env))
        cleanup.callback(_stop_and_delete_model_queue, deployment)
        _write_corpus(s3, config)
        log(f"corpus: {config.num_rows:,} rows in {config.num_files} files on s3://{BUCKET}/corpus/")

        _build_cpu_kernels()
        pool = WorkerPool(deployment, MODEL_NAME, config.num_workers)
        cleanup.callback(pool.close)
        pool.start()
        pool.wait_ready()
        client = retrying_transient(deployment.client)
        schedule = plan_faults(config.seed, config.profile)
        injector = FaultInjector(schedule, broker=config.broker, pool=pool, proxy=proxy, receiver=receiver, log=log)
        started = time.monotonic()
        injector.start()
        try:
            jobs = _run_waves(client, config, receiver.url, injector, started + config.timeout_s, log)
        finally:
            injector.stop()
        jobs_done_s = time.monotonic() - started
        log(f"jobs final after {jobs_done_s / 60:.1f} min; faults ended; waiting for the webhooks to settle")
        retrying_transient(lambda: _wait_settled(client, jobs, config.settle_s))
        pool.close()
        elapsed_s = time.monotonic() - started
        return retrying_transient(lambda: check_soak(
            config=config, client=client, jobs=jobs, s3=s3, pool=pool, injector=injector, proxy=proxy,
            receiver=receiver, deployment=deployment, elapsed_s=elapsed_s, jobs_done_s=jobs_done_s))


def _restore_environ(saved: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(saved)


def _build_cpu_kernels() -> None:
    """Build the CPU kernels before any worker needs them, as the test session does: the
    workers the soak kills should die in their work, not all in one compile."""
    from engine.kernels import cpu_ops
    cpu_ops.cpu_kernels_available()


def _save_model(folder: Path) -> Path:
    from tests.support.random_embedders import save_random_bert
    if not (folder / "config.json").exists():
        save_random_bert(folder)
    return folder


def _s3_env(endpoint_url: str) -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": endpoint_url,
            "AWS_DEFAULT_REGION": "us-east-1"}


def _write_corpus(s3, config: SoakConfig) -> None:
    """Files of short texts (the rows' cost is the system's, not the model's), ids 0..num_rows-1."""
    import s3fs
    s3.create_bucket(BUCKET)
    fs = s3fs.S3FileSystem(**s3.storage_options)   # straight to the server: setup is not under test
    rows_per_file = -(-config.num_rows // config.num_files)
    for index in range(config.num_files):
        ids = range(index * rows_per_file, min((index + 1) * rows_per_file, config.num_rows))
        table = pa.table({"doc_id": pa.array(ids, pa.int64()), "text": [f"soak row {i}" for i in ids]})
        with fs.open(f"{BUCKET}/corpus/part-{index:05d}.parquet", "wb") as file:
            pq.write_table(table, file, row_group_size=config.rows_per_group)


def corpus_files(config: SoakConfig, share: float) -> tuple[tuple[str, ...], range]:
    """The first `share` of the corpus files, and the ids they hold."""
    rows_per_file = -(-config.num_rows // config.num_files)
    num_files = max(1, round(config.num_files * share))
    urls = tuple(f"s3://{BUCKET}/corpus/part-{index:05d}.parquet" for index in range(num_files))
    return urls, range(min(num_files * rows_per_file, config.num_rows))


def _run_waves(client, config: SoakConfig, webhook_url: str, injector: FaultInjector, deadline: float,
               log) -> list[SoakJob]:
    """Waves of jobs, each submitted once the one before is final, until every fault has
    been played: the faults always meet running jobs. Returns every job submitted."""
    jobs: list[SoakJob] = []
    for wave in itertools.count():
        batch = _submit_jobs(client, config, webhook_url, wave)
        log(f"wave {wave}: " + ", ".join(f"{j.name} {j.job_id}" for j in batch))
        jobs += batch
        _wait_final(client, batch, deadline, log)
        if injector.is_done() or time.monotonic() > deadline:
            return jobs
    return jobs


def _submit_jobs(client, config: SoakConfig, webhook_url: str, wave: int) -> list[SoakJob]:
    """Three jobs at once: the whole corpus; half of it with progress events; a quarter
    with a deadline (it succeeds in time or expires with what it finished)."""
    from jobs import JobSpec
    plans = [("whole", 1.0, {}), ("half", 0.5, {"webhook_events": ("job.progress",), "priority": 7}),
             ("deadline", 0.25, {"expires_after_s": config.deadline_s, "priority": 2})]
    jobs = []
    for name, share, fields in plans:
        inputs, ids = corpus_files(config, share)
        output = f"s3://{BUCKET}/out/{wave}/{name}/"
        spec = JobSpec(mode="embed", model=MODEL_NAME, input=inputs, id_column="doc_id", output=output,
                       max_rows_per_shard=config.rows_per_shard, webhook_url=webhook_url, **fields)
        job = retrying_transient(lambda: client.submit(spec))
        jobs.append(SoakJob(name=f"{wave}/{name}", job_id=job.id, output=output, expected_ids=ids,
                            expires_after_s=fields.get("expires_after_s")))
    return jobs


def _wait_final(client, jobs: list[SoakJob], deadline: float, log) -> None:
    last_report = 0.0
    while time.monotonic() < deadline:
        states = [_progress(client, job.job_id) for job in jobs]
        if all(state is not None and state.is_finished for state in states):
            return
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            log("  " + "; ".join(f"{job.name}: " + (f"{s.status} {s.rows_done:,}/{s.rows_total:,}" if s else "db down")
                                 for job, s in zip(jobs, states)))
        time.sleep(2)


def _progress(client, job_id: str):
    """The job's progress, or None while the database is away."""
    from jobs.transient import is_transient
    try:
        return client.store.progress(job_id)
    except Exception as error:
        if not is_transient(error):
            raise
        return None


def retrying_transient(action, timeout_s: float = 120.0):
    """action(), tried again while it fails for a reason that passes (the database restarting:
    the soak's own, or another test's on this shared machine)."""
    from jobs.transient import is_transient
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return action()
        except Exception as error:
            if not is_transient(error) or time.monotonic() > deadline:
                raise
            time.sleep(1)


def _wait_settled(client, jobs: list[SoakJob], timeout_s: float) -> None:
    """Until no event of these jobs is pending (delivered or given up) and every
    unfinished job's partial manifest is written, or the timeout."""
    from jobs.outbox import PENDING
    deadline = time.monotonic() + timeout_s
    job_ids = {job.job_id for job in jobs}
    while time.monotonic() < deadline:
        events = [e for e in client.store.outbox.events() if e.job_id in job_ids]
        owed = client.store.stale_partial_outputs(0)
        if events and all(e.status != PENDING for e in events) and not set(owed) & job_ids:
            return
        time.sleep(1)


def _stop_and_delete_model_queue(deployment) -> None:
    """The stack deletes the queues it knows; the soak model's is the soak's to delete,
    once no worker is left to declare it again."""
    from jobs.models import resolve_model
    from jobs.settings import Settings
    from queueing.app import create_app
    from jobs.messaging import model_queue, queue_name
    deployment.stop_workers()
    env = deployment.env
    settings = Settings.from_env(env)
    key = resolve_model(MODEL_NAME, {**os.environ, **env}).key
    with create_app(settings).connection_for_write() as conn:
        channel = conn.channel()
        try:
            channel.queue_delete(queue_name(settings.namespace, model_queue(key)))
        except Exception:   # never declared, or already gone
            pass
        finally:
            channel.close()
