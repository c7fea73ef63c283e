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
from jobs.report import format_report, job_report
from jobs.settings import Settings
from queueing import planning
from queueing.app import create_app
from queueing.pipeline import ShardPipeline
from queueing.runtime import EngineKey, Runtime, WorkerOptions
from queueing.worker import ShardWork, begin_shard, run_shard

NUM_ROWS, ROWS_PER_SHARD, CHUNK_ROWS = 300, 100, 64


class RecordingEngine:
    """The real engine, with a record of each call's row ids (to see which shards met)."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[list[int]] = []

    def encode(self, texts, params):
        return self.engine.encode(texts, params)

    @property
    def settings(self) -> dict:
        return self.engine.settings


@pytest.fixture
def deployment(tmp_path):
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")})
    client = Client(settings=settings)
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings),
                      options=WorkerOptions(chunk_rows=CHUNK_ROWS, lease_s=30.0))
    from jobs.models import resolve_model
    ref = resolve_model("minilm")
    runtime.models[ref.key] = ref
    engine = RecordingEngine(runtime.engine_for(EngineKey(ref.key, "embed")))
    runtime.engines[EngineKey(ref.key, "embed")] = engine
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

    def infer(eng, job, ids, inputs, row_params=None):
        engine.calls.append(ids.to_pylist())
        return real_infer(eng, job, ids, inputs, row_params)
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


GENERATE_ROWS, GENERATE_SHARD_ROWS, MAX_NUM_SEQS = 60, 20, 8


@pytest.fixture
def generate_deployment(tmp_path):
    from engine import Engine
    from jobs.models import resolve_model
    from tests.support.random_decoders import save_random_decoder
    folder = save_random_decoder(tmp_path / "llama", "llama")
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")})
    client = Client(settings=settings)
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings),
                      options=WorkerOptions(chunk_rows=CHUNK_ROWS, lease_s=30.0))
    ref = resolve_model(str(folder))
    runtime.models[ref.key] = ref
    runtime.engines[EngineKey(ref.key, "generate")] = Engine.from_pretrained(folder, mode="generate",
                                                                             max_num_seqs=MAX_NUM_SEQS)
    yield client, runtime, folder
    client.store.engine.dispose()


def submit_generate_job(client, runtime, tmp_path, folder, name: str) -> str:
    corpus = tmp_path / "prompts.parquet"
    if not corpus.exists():
        lines = [line for line in open("/usr/share/common-licenses/GPL-3").read().split("\n") if line.strip()]
        prompts = [" ".join(lines[i:i + 1 + i % 4]) for i in range(GENERATE_ROWS)]   # 1-4 lines each
        pq.write_table(pa.table({"doc_id": pa.array(range(GENERATE_ROWS), pa.int64()), "prompt": prompts}),
                       corpus, row_group_size=GENERATE_SHARD_ROWS)
    job = client.submit(JobSpec(mode="generate", model=str(folder), input=str(corpus), input_column="prompt",
                                id_column="doc_id", output=str(tmp_path / name), max_rows_per_shard=GENERATE_SHARD_ROWS,
                                params={"max_tokens": 24, "temperature": 0.8, "seed": 7, "stop": ["e "]}))
    planning.plan_job(runtime, job.id)
    return job.id


def test_generate_rows_of_many_shards_share_one_running_batch(generate_deployment, tmp_path, monkeypatch):
    from queueing.generate_feed import GenerateFeed
    client, runtime, folder = generate_deployment
    running_shards, out_of_order = [], []
    real_step, real_put = GenerateFeed.step, ShardWork.put

    def step(self):   # which shards have requests in the running batch at each step
        running = {request.request_id for request in self.llm.scheduler.running}
        running_shards.append({w.shard_index for rid, (w, _) in self._requests.items() if rid in running})
        return real_step(self)

    def put(self, index, output):
        out_of_order.append(index != len(self.outputs))
        real_put(self, index, output)
    monkeypatch.setattr(GenerateFeed, "step", step)
    monkeypatch.setattr(ShardWork, "put", put)

    job_id = submit_generate_job(client, runtime, tmp_path, folder, "piped")
    pipeline = ShardPipeline(runtime, depth=1)
    for shard_index in range(GENERATE_ROWS // GENERATE_SHARD_ROWS):
        pipeline.submit(begin_shard(runtime, job_id, shard_index))
    pipeline.close(timeout_s=120)

    shards = client.store.list_shards(job_id)
    assert [s.status for s in shards] == [ShardStatus.COMMITTED] * 3
    assert any(len(shards_in_step) > 1 for shards_in_step in running_shards), "a step ran rows of two shards"
    assert any(out_of_order), "short outputs overtook long ones and still landed in their rows"

    # The same job through the synchronous path (an engine.generate call per shard,
    # which drains the batch at each shard's end) takes more steps for the same rows,
    # and writes the same rows: greedy output does not depend on the batch a row ran in.
    sync_steps = []
    [engine] = runtime.engines.values()
    engine.add_step_observer(lambda stats: sync_steps.append(1))
    other = submit_generate_job(client, runtime, tmp_path, folder, "sync")
    for shard_index in range(3):
        assert run_shard(runtime, other, shard_index).status == "committed"
    assert len(running_shards) < len(sync_steps), (len(running_shards), len(sync_steps))
    for a, b in zip(shards, client.store.list_shards(other)):
        piped, sync = pq.read_table(tmp_path / "piped" / a.part["name"]), pq.read_table(tmp_path / "sync" / b.part["name"])
        assert piped.column("doc_id").to_pylist() == sync.column("doc_id").to_pylist()
        assert piped.column("text").to_pylist() == sync.column("text").to_pylist()
        assert piped.column("finish_reason").to_pylist() == sync.column("finish_reason").to_pylist()

    # Both report their prefill (issue 47): the feed's bound is each shard's prefix order's, the
    # synchronous path's each engine.generate call's. The first job ran on an empty cache, so it
    # computed no fewer prompt tokens than its bound; the second found blocks of the same prompts
    # still cached (jobs.generate_usage's NOTE: the bound holds against an empty cache only).
    prompt_tokens = sum(pq.read_table(tmp_path / "piped" / shard.part["name"]).column("num_prompt_tokens")
                        .to_numpy().sum() for shard in shards)
    for job in (job_id, other):
        report = job_report(client.store, job)
        prefill = report.generate.prefill
        assert prefill.num_prompt_tokens == prompt_tokens
        assert prefill.num_computed_tokens + prefill.num_cached_tokens == prompt_tokens
        assert prefill.num_lower_bound > 0
        if job == job_id:
            assert prefill.num_lower_bound <= prefill.num_computed_tokens, prefill
        else:
            assert prefill.num_cached_tokens > 0, prefill
        assert report.generate.adapters == (), "a job without adapters counts none"
        assert "  prefill: " in format_report(report) and "adapters:" not in format_report(report)


def test_a_cancelled_generate_job_aborts_its_requests_mid_batch(generate_deployment, tmp_path, monkeypatch):
    from queueing.generate_feed import GenerateFeed
    client, runtime, folder = generate_deployment
    runtime.options = dataclasses.replace(runtime.options, lease_s=0.4)   # renewals every 0.1 s
    job_id = submit_generate_job(client, runtime, tmp_path, folder, "cancelled")
    steps, real_step = [], GenerateFeed.step

    def step(self):
        steps.append(self.num_requests)
        if len(steps) == 3:
            client.job(job_id).cancel()
        time.sleep(0.02)   # the lease keeper notices within a few steps
        return real_step(self)
    monkeypatch.setattr(GenerateFeed, "step", step)

    pipeline = ShardPipeline(runtime, depth=2)
    for shard_index in range(GENERATE_ROWS // GENERATE_SHARD_ROWS):
        pipeline.submit(begin_shard(runtime, job_id, shard_index))
    pipeline.close(timeout_s=60)

    assert [s.status for s in client.store.list_shards(job_id)] == [ShardStatus.CANCELLED] * 3
    assert len(steps) < 60, "it stopped stepping soon after the cancellation"
    llm = pipeline._feed.llm
    assert pipeline._feed.num_requests == 0 and not llm.has_unfinished_requests, "requests aborted"
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks, "their KV blocks freed"
