"""Shard usage in SQL (migrations 0005 and 0020): tokens, engine and a generate shard's
prefill and rows per adapter recorded at commit, then throughput, worker time by device
and the job report read back — on SQLite and PostgreSQL alike."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from jobs import tables
from jobs.generate_usage import AdapterUsage, GenerateUsage, Prefill
from jobs.report import format_report, job_report
from jobs.status import JobStatus, ShardStatus
from jobs.store import MIGRATIONS, Store
from test_store import make_plans, new_job, part, postgres_url, store, store_url  # noqa: F401 (fixtures)

CPU = {"model": "all-MiniLM-L6-v2", "mode": "embed", "device": "cpu", "dtype": "float32"}
CUDA = {**CPU, "device": "cuda", "device_name": "NVIDIA H200"}


def run_shard(store: Store, job_id: str, shard_index: int, *, seconds: float, tokens: int, engine: dict,
              rows_failed: int = 0, generate_usage: GenerateUsage | None = None) -> None:
    claim = store.claim_shard(job_id, shard_index, worker_id="w")
    # Given the attempt ran `seconds`: move its start back rather than sleeping.
    with store.engine.begin() as conn:
        conn.execute(sa.update(tables.shards).where(tables.shards.c.job_id == job_id,
                                                    tables.shards.c.shard_index == shard_index)
                     .values(started_at=time.time() - seconds))
    committed, _ = store.commit_shard(job_id, shard_index, claim.token, part=part(shard_index),
                                      rows_succeeded=10 - rows_failed, rows_failed=rows_failed,
                                      num_tokens=tokens, engine=engine, generate_usage=generate_usage)
    assert committed


def test_progress_reports_tokens_rates_and_time_queued_and_running(store):
    job_id = new_job(store)                       # 30 rows in 3 shards of 10
    store.start_job(job_id, make_plans(3))
    run_shard(store, job_id, 0, seconds=2.0, tokens=150, engine=CPU)
    run_shard(store, job_id, 1, seconds=2.0, tokens=250, engine=CPU, rows_failed=1)
    progress = store.progress(job_id)
    t = progress.throughput
    assert (progress.rows_done, progress.num_tokens) == (20, 400)
    assert 2.0 <= t.running_s < 10 and t.queued_s >= 0
    assert t.rows_per_s == pytest.approx(20 / t.running_s)
    assert t.recent_tokens_per_s == pytest.approx(400 / t.running_s), "both shards are within the window"
    assert t.eta_s == pytest.approx(10 / t.recent_rows_per_s)
    assert t.worker_s == pytest.approx(4.0, abs=0.5)


def test_report_sums_worker_time_by_device_and_prices_it(store):
    job_id = new_job(store)
    store.start_job(job_id, make_plans(3))
    run_shard(store, job_id, 0, seconds=36.0, tokens=500_000, engine=CUDA)
    run_shard(store, job_id, 1, seconds=36.0, tokens=500_000, engine=CUDA)
    run_shard(store, job_id, 2, seconds=72.0, tokens=0, engine=CPU)
    report = job_report(store, job_id, price_per_hour=2.0)
    assert report.worker_s_by_device == pytest.approx({"cuda": 72.0, "cpu": 72.0}, abs=0.5)
    assert report.engines == [CPU, CUDA]
    assert report.cost.worker_hours == pytest.approx(144 / 3600, abs=1e-3)
    assert report.cost.total == pytest.approx(2.0 * 144 / 3600, abs=1e-3)
    assert report.cost.per_million_tokens == pytest.approx(report.cost.total, rel=1e-6), "1M tokens in all"
    assert (report.rows_succeeded, report.num_tokens, report.num_shards) == (30, 1_000_000, 3)
    assert "device_name=NVIDIA H200" in format_report(report)
    assert job_report(store, job_id).cost is None


def test_a_generate_jobs_report_sums_its_committed_shards_prefill_and_adapters(store):
    # Given a generate job of three shards: two committed with their usage, one still running
    job_id = new_job(store, mode="generate", model="smollm2", id_column=None, webhook_url=None,
                     params={"max_tokens": 8, "adapter_column": "adapter"})
    store.start_job(job_id, make_plans(3))
    sql = "s3://adapters/sql/"
    run_shard(store, job_id, 0, seconds=1.0, tokens=700, engine=CPU, generate_usage=GenerateUsage(
        Prefill(600, 200, 350), (AdapterUsage(None, 4, 300), AdapterUsage(sql, 6, 400))))
    run_shard(store, job_id, 1, seconds=1.0, tokens=500, engine=CPU, generate_usage=GenerateUsage(
        Prefill(400, 0, 380), (AdapterUsage(sql, 10, 500),)))
    store.claim_shard(job_id, 2, worker_id="w")
    # When the report is read
    report = job_report(store, job_id)
    # Then
    assert report.generate == GenerateUsage(Prefill(1000, 200, 730), (AdapterUsage(None, 4, 300),
                                                                     AdapterUsage(sql, 16, 900)))
    assert report.to_dict()["prefill"]["num_computed_tokens"] == 800
    assert "  adapters: base 4 rows 300 tokens; s3://adapters/sql/ 16 rows 900 tokens" in format_report(report)


def test_a_job_without_commits_reports_nothing_yet(store):
    job_id = new_job(store)
    progress = store.progress(job_id)
    assert progress.status == JobStatus.QUEUED and progress.num_tokens == 0
    assert progress.throughput.rows_per_s is None and progress.throughput.eta_s is None
    assert job_report(store, job_id).worker_s_by_device == {}


def test_shard_counts_by_model_cover_running_jobs_only(store):
    job_id = new_job(store)
    store.start_job(job_id, make_plans(3))
    store.claim_shard(job_id, 0, worker_id="w")
    assert store.shard_counts_by_model() == {("all-MiniLM-L6-v2", "pending"): 2, ("all-MiniLM-L6-v2", "running"): 1}
    store.finish_job(job_id, JobStatus.CANCELLED)
    assert store.shard_counts_by_model() == {}


def store_at(tmp_path, revision: str) -> Store:
    """A SQLite store migrated up to `revision` only, as a deployment of then left it."""
    store = Store(f"sqlite:///{tmp_path / 'old.db'}")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        config.attributes["secret_box"] = store.secrets
        command.upgrade(config, revision)
    return store


def test_migration_0005_keeps_existing_shards_with_zero_tokens(tmp_path):
    old = store_at(tmp_path, "0004")
    with old.engine.begin() as conn:   # a job and shard as a 0004 deployment wrote them
        conn.execute(sa.text("INSERT INTO barge_jobs (id, status, mode, model_key, spec, rows_total, output_schema, "
                             "created_at, updated_at) VALUES ('j', 2, 'embed', 'm', '{}', 10, 's', 0, 0)"))
        conn.execute(sa.text("INSERT INTO barge_shards (job_id, shard_index, plan, num_rows, status, attempt, "
                             "rows_succeeded, rows_failed, updated_at) VALUES ('j', 0, '{}', 10, 0, 0, 0, 0, 0)"))
    old.migrate()
    with old.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT num_tokens, device, engine FROM barge_shards")).one() == (0, None, None)
    old.engine.dispose()


def test_migration_0020_keeps_generate_shards_committed_before_it_and_reports_them_as_before(tmp_path):
    # Given a generate job's shard committed on a 0019 deployment
    old = store_at(tmp_path, "0019")
    spec = '{"mode": "generate", "model": "smollm2", "input": "/in/a.parquet", "output": "/out/"}'
    with old.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO barge_jobs (id, status, mode, model_key, spec, rows_total, output_schema, "
                             "created_at, updated_at) VALUES ('j', :running, 'generate', 'm', :spec, 10, 's', 0, 0)"),
                     {"running": int(JobStatus.RUNNING), "spec": spec})
        conn.execute(sa.text("INSERT INTO barge_shards (job_id, shard_index, plan, num_rows, status, attempt, "
                             "rows_succeeded, rows_failed, updated_at, num_tokens, started_at, finished_at) "
                             "VALUES ('j', 0, '{}', 10, :committed, 1, 10, 0, 0, 90, 1, 2)"),
                     {"committed": int(ShardStatus.COMMITTED)})
    # When the store is migrated and the job reported
    old.migrate()
    # Then the shard recorded no usage, and the report reads as a report before 0020
    with old.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT generate_usage FROM barge_shards")).scalar_one() is None
    report = job_report(old, "j")
    assert report.generate is None and report.num_tokens == 90
    assert "prefill" not in report.to_dict() and "prefill" not in format_report(report)
    old.engine.dispose()
