"""The shard pipeline with a real store, a real model and real part files: shards of
one job share engine calls across their boundary, each is committed when its own last
row is done, and a lost claim or a drain ends shards inside the pipeline."""

from __future__ import annotations

import dataclasses
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs import JobSpec, ShardStatus
from jobs.client import Client
from jobs.settings import Settings
from queueing import planning
from queueing.app import create_app
from queueing.pipeline import ShardPipeline
from queueing.runtime import Runtime, WorkerOptions
from queueing.worker import ShardWork, begin_shard, run_shard

NUM_ROWS, ROWS_PER_SHARD, CHUNK_ROWS = 300, 100, 64


class RecordingEngine:
    """The real engine, with a record of each call's row ids (to see which shards met)."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[list[int]] = []

    def encode(self, texts, **params):
        return self.engine.encode(texts, **params)


@pytest.fixture
def deployment(tmp_path):
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")})
    client = Client(settings=settings)
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings),
                      options=WorkerOptions(chunk_rows=CHUNK_ROWS, lease_s=30.0))
    from jobs.models import resolve_model
    ref = resolve_model("minilm")
    runtime.models[ref.key] = ref
    engine = RecordingEngine(runtime.engine_for(ref.key, "embed"))
    runtime.engines[(ref.key, "embed")] = engine
    yield client, runtime, engine
    client.store.engine.dispose()


def submit_job(client, runtime, tmp_path, name: str) -> str:
    corpus = tmp_path / "corpus.parquet"
    if not corpus.exists():
        pq.write_table(pa.table({"doc_id": pa.array(range(NUM_ROWS), pa.int64()),
                                 "text": [f"Row {i} about barges, locks and canals." for i in range(NUM_ROWS)]}),
                       corpus, row_group_size=ROWS_PER_SHARD)
    job = client.submit(JobSpec(mode="embed", model="minilm", input=str(corpus), id_column="doc_id",
                                output=str(tmp_path / name), max_rows_per_shard=ROWS_PER_SHARD))
    planning.plan_job(runtime, job.id)
    return job.id


def record_calls(monkeypatch, engine: RecordingEngine):
    import queueing.worker as worker
    real_infer = worker.infer

    def infer(eng, job, ids, inputs):
        engine.calls.append(ids.to_pylist())
        return real_infer(eng, job, ids, inputs)
    monkeypatch.setattr(worker, "infer", infer)


def test_shards_of_one_job_share_engine_calls_and_commit_in_order(deployment, tmp_path, monkeypatch):
    client, runtime, engine = deployment
    record_calls(monkeypatch, engine)
    job_id = submit_job(client, runtime, tmp_path, "piped")
    pipeline = ShardPipeline(runtime, depth=2)
    for shard_index in range(NUM_ROWS // ROWS_PER_SHARD):
        work = begin_shard(runtime, job_id, shard_index)
        assert isinstance(work, ShardWork)
        pipeline.submit(work)
    pipeline.close(timeout_s=120)

    shards = client.store.list_shards(job_id)
    assert [s.status for s in shards] == [ShardStatus.COMMITTED] * 3
    assert all(len(call) <= CHUNK_ROWS for call in engine.calls)
    assert sorted(i for call in engine.calls for i in call) == list(range(NUM_ROWS)), "every row once"
    # the calls stay full across shard boundaries: rows 64..127 span shards 0 and 1
    assert any(min(call) < ROWS_PER_SHARD <= max(call) for call in engine.calls)
    assert len(engine.calls) == -(-NUM_ROWS // CHUNK_ROWS)
    assert all(s.finished_at for s in shards) and shards[0].finished_at <= shards[2].finished_at

    # the same job through the synchronous path writes the same parts
    engine.calls.clear()
    other = submit_job(client, runtime, tmp_path, "sync")
    for shard_index in range(3):
        assert run_shard(runtime, other, shard_index).status == "committed"
    for a, b in zip(client.store.list_shards(job_id), client.store.list_shards(other)):
        piped, sync = pq.read_table(tmp_path / "piped" / a.part["name"]), pq.read_table(tmp_path / "sync" / b.part["name"])
        assert piped.column("doc_id").to_pylist() == sync.column("doc_id").to_pylist()
        assert piped.column("num_tokens").to_pylist() == sync.column("num_tokens").to_pylist()
        for u, v in zip(piped.column("embedding").to_pylist(), sync.column("embedding").to_pylist()):
            assert max(abs(x - y) for x, y in zip(u, v)) < 1e-5


def test_a_cancelled_job_and_a_drain_end_the_shards_in_the_pipeline(deployment, tmp_path):
    client, runtime, _ = deployment
    runtime.options = dataclasses.replace(runtime.options, lease_s=0.4)   # renewals every 0.1 s
    cancelled = submit_job(client, runtime, tmp_path, "cancelled")
    drained = submit_job(client, runtime, tmp_path, "drained")
    works = [begin_shard(runtime, cancelled, 0), begin_shard(runtime, drained, 0)]
    client.job(cancelled).cancel()
    time.sleep(0.5)   # the lease keeper notices the cancellation at its next renewal
    runtime.drain_deadline = time.monotonic() - 1      # draining, past the grace period
    pipeline = ShardPipeline(runtime, depth=2)
    for work in works:
        pipeline.submit(work)
    pipeline.close(timeout_s=30)
    assert client.store.list_shards(cancelled)[0].status == ShardStatus.CANCELLED
    released = client.store.list_shards(drained)[0]
    assert released.status == ShardStatus.PENDING and released.token is None, dataclasses.asdict(released)
