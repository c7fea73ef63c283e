"""A LoRA job's submit and run (issue 44, jobs.adapters): real PEFT adapters saved by peft
on a small random Llama folder, submitted through Client.submit with a real SQLite store.

Given an adapter that cannot be read, one of too large a rank, and one made for another
base's shapes, when each is submitted, then it is refused naming `adapter` and nothing is
queued; an adapter column with an incremental job, or of the wrong type, is refused naming
`params.adapter_column`. A good adapter, by path or fsspec URL, is queued, and an
incremental job's results cache is keyed by the adapter's bytes. Run by run_shard in this
process (no pipeline: queueing.inference's engine call, not the generate feed), a job's
rows each get their adapter's text, and a row naming a missing adapter its error; its report
and manifest count the rows and tokens of each adapter and the prefill (issues 44 and 47)."""

from __future__ import annotations

import re
import shutil

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from jobs import JobSpec, JobSpecError, JobStatus
from jobs.models import resolve_model
from jobs.report import format_report, job_report
from queueing import planning
from queueing.app import create_app
from queueing.finalize import finalize_job
from queueing.runtime import EngineKey, Runtime, WorkerOptions
from queueing.worker import run_shard
from storage.manifest import read_manifest
from tests.support.lora_adapters import ATTENTION, MLP, lora_client, save_random_adapter
from tests.support.random_decoders import save_random_decoder

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

MAX_RANK = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A base model folder, and adapters: good (r4), large (r16), misfit (another base's shapes)."""
    root = tmp_path_factory.mktemp("lora")
    base = save_random_decoder(root / "base", "llama")
    other = save_random_decoder(root / "other", "llama", hidden_size=32, intermediate_size=64)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    other_model = transformers.AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32)
    return {"base": base,
            "good": save_random_adapter(model, root / "good", 4, ATTENTION + MLP, 1, 0.1),
            "large": save_random_adapter(model, root / "large", 16, ATTENTION, 2, 0.1),
            "misfit": save_random_adapter(other_model, root / "misfit", 4, MLP, 3, 0.1)}


@pytest.fixture
def client(tmp_path, monkeypatch):
    yield from lora_client(tmp_path, monkeypatch, MAX_RANK)


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["a barge", "a river"], "adapter": ["good", None], "rank": [1, 2]}),
                   folder / "part.parquet")
    return folder


def spec(folders, corpus, tmp_path, **fields) -> JobSpec:
    return JobSpec(**{"mode": "generate", "model": str(folders["base"]), "input": str(corpus),
                      "output": str(tmp_path / "out"), "params": {"max_tokens": 4}, **fields})


def refused(client, job: JobSpec) -> JobSpecError:
    with pytest.raises(JobSpecError) as caught:
        client.submit(job)
    assert client.store.list_jobs() == [], "a refused job is not recorded"
    return caught.value


def test_an_adapter_that_cannot_serve_is_refused_at_submit_naming_it(client, folders, corpus, tmp_path):
    no_weights = tmp_path / "no-weights"
    shutil.copytree(folders["good"], no_weights)
    (no_weights / "adapter_model.safetensors").unlink()
    cases = {str(tmp_path / "missing"): "cannot be read", str(no_weights): "cannot be read",
             str(folders["large"]): f"r=16 exceeds this engine's max_lora_rank={MAX_RANK}",
             str(folders["misfit"]): r"lora_A has shape \[4, 64\]; r=4 on this base model needs \[4, 128\]"}
    for adapter, message in cases.items():
        error = refused(client, spec(folders, corpus, tmp_path, adapter=adapter))
        assert error.field == "adapter" and re.search(message, error.problem), (adapter, error.problem)


def test_an_adapter_column_is_refused_with_incremental_and_unless_it_holds_text(client, folders, corpus, tmp_path):
    column = {"max_tokens": 4, "adapter_column": "adapter"}
    error = refused(client, spec(folders, corpus, tmp_path, params=column, incremental=True))
    assert error.field == "params.adapter_column" and "incremental" in error.problem
    error = refused(client, spec(folders, corpus, tmp_path, params={**column, "adapter_column": "rank"}))
    assert error.field == "params.adapter_column" and "adapter locations" in error.problem
    error = refused(client, spec(folders, corpus, tmp_path, params={**column, "adapter_column": "nope"}))
    assert error.field == "params.adapter_column"


def test_a_good_adapter_is_queued_by_path_or_url_and_keys_the_cache(client, folders, corpus, tmp_path):
    memory = fsspec.filesystem("memory")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        memory.pipe(f"/lora-submit/good/{name}", (folders["good"] / name).read_bytes())
    try:
        by_url = client.submit(spec(folders, corpus, tmp_path, adapter="memory://lora-submit/good",
                                    output=str(tmp_path / "url")))
    finally:
        memory.rm("/lora-submit", recursive=True)
    by_path = client.submit(spec(folders, corpus, tmp_path, adapter=str(folders["good"]), incremental=True))
    base = client.submit(spec(folders, corpus, tmp_path, incremental=True, output=str(tmp_path / "base")))
    per_row = client.submit(spec(folders, corpus, tmp_path, params={"max_tokens": 4, "adapter_column": "adapter"},
                                 output=str(tmp_path / "rows")))
    jobs = {job.id: job for job in client.store.list_jobs()}
    assert set(jobs) == {by_url.id, by_path.id, base.id, per_row.id}
    assert jobs[by_path.id].spec.adapter == str(folders["good"])
    namespaces = {client.store.get_job(job.id).cache_namespace for job in (by_path, base)}
    assert len(namespaces) == 2 and None not in namespaces, "the adapter's job has a cache of its own"


def test_a_worker_without_a_pipeline_runs_each_row_with_its_adapter(client, folders, tmp_path):
    from engine import SamplingParams
    runtime = Runtime(settings=client.settings, store=client.store, app=create_app(client.settings),
                      options=WorkerOptions(chunk_rows=2, lease_s=30.0, pipeline_depth=0))
    ref = resolve_model(str(folders["base"]))
    runtime.models[ref.key] = ref
    prompts = ["a barge on the river", "the lock fills", "steel and grain", "a towpath", "the weir"]
    adapters = [str(folders["good"]), None, str(folders["good"]), str(tmp_path / "missing"), None]
    corpus = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"doc_id": pa.array(range(5), pa.int64()), "text": prompts,
                             "adapter": pa.array(adapters, pa.string())}), corpus)
    job = client.submit(JobSpec(mode="generate", model=str(folders["base"]), input=str(corpus), id_column="doc_id",
                                output=str(tmp_path / "out"), max_rows_per_shard=3,
                                params={"max_tokens": 6, "temperature": 0.0, "adapter_column": "adapter"}))
    planning.plan_job(runtime, job.id)
    for shard in client.store.list_shards(job.id):
        assert run_shard(runtime, job.id, shard.shard_index).status == "committed"
    finalize_job(runtime, job.id)
    assert job.status().status == JobStatus.SUCCEEDED

    table = job.results().sort_by("doc_id")
    engine = runtime.engines[EngineKey(ref.key, "generate", lora=True)]
    assert engine.llm.lora.options.max_lora_rank == MAX_RANK
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    alone = [engine.generate([prompt], greedy, adapter=adapter)[0].text if row != 3 else None
             for row, (prompt, adapter) in enumerate(zip(prompts, adapters))]
    assert table.column("text").to_pylist() == alone
    assert alone[0] != engine.generate([prompts[0]], greedy)[0].text, "the adapter changed the text"
    assert "no adapter_config.json" in table.column("error").to_pylist()[3]

    # The report and the manifest: every row under its adapter, tokens and prefill consistent with the output
    report = job_report(client.store, job.id)
    usage = report.generate
    assert {a.adapter: a.num_rows for a in usage.adapters} == {None: 2, str(folders["good"]): 2,
                                                                str(tmp_path / "missing"): 1}
    assert sum(a.num_rows for a in usage.adapters) == report.rows_succeeded + report.rows_failed == 5
    assert sum(a.num_tokens for a in usage.adapters) == report.num_tokens
    num_prompt_tokens = sum(n or 0 for n in table.column("num_prompt_tokens").to_pylist())
    prefill = usage.prefill
    assert prefill.num_prompt_tokens == num_prompt_tokens > 0
    assert prefill.num_computed_tokens + prefill.num_cached_tokens == num_prompt_tokens
    assert 0 < prefill.num_lower_bound <= prefill.num_computed_tokens, "each engine.generate call's bound, summed"
    assert f"  adapters: base 2 rows {usage.adapters[0].num_tokens:,} tokens; " in format_report(report)
    stats = read_manifest(str(tmp_path / "out")).stats
    assert stats["prefill"] == report.to_dict()["prefill"] and stats["adapters"] == report.to_dict()["adapters"]
