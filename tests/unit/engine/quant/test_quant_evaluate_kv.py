"""`barge eval-quant --kv-cache-dtype fp8`: the perplexities of a random Llama with an fp8
KV cache, under its own weights and FP8 ones, reported beside the weights' figures."""

import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from engine.quant.evaluate import evaluate  # noqa: E402
from tests.support.random_decoders import save_random_decoder  # noqa: E402

TEXTS = {"first": "The quick brown fox jumps over the lazy dog. " * 6,
         "second": "Licences grant rights under conditions, and documentation explains them. " * 5}
PROMPTS = [f"Sentence number {i} of the sample, long enough to prompt." for i in range(10)]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_random_decoder(tmp_path_factory.mktemp("llama"), "llama")


def test_the_fp8_kv_cache_figures_sit_beside_the_weights(llama):
    result = evaluate(llama, "fp8", texts=PROMPTS, num_tokens=64, max_tokens=4, perplexity_texts=TEXTS,
                      kv_cache_dtype="fp8", max_num_batched_tokens=16)
    assert result.kv_cache_dtype == "fp8" and [text.name for text in result.perplexities] == list(TEXTS)
    for text in result.perplexities:
        assert all(math.isfinite(figure) and figure > 1 for figure in (text.kv_fp8, text.both_fp8))
        # another cache, another figure: the fp8 cache was read
        assert text.kv_fp8 != text.baseline
    assert result.worst_kv_change == max(text.kv_change for text in result.perplexities)
    report = result.format()
    assert "fp8 KV cache: float32" in report and "worst perplexity change with the fp8 KV cache" in report


def test_without_the_flag_the_report_is_as_before(llama):
    result = evaluate(llama, "fp8", texts=PROMPTS, num_tokens=32, max_tokens=2, perplexity_texts=TEXTS)
    assert result.worst_kv_change is None and "KV cache" not in result.format()


def test_the_kv_cache_dtype_is_refused_where_it_means_nothing(llama):
    with pytest.raises(ValueError, match="kv_cache_dtype applies to generate models"):
        evaluate(llama, "fp8", mode="embed", texts=PROMPTS, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        evaluate(llama, "fp8", texts=PROMPTS, kv_cache_dtype="int8")
