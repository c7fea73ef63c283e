"""LLM-based embedders (Qwen3-Embedding style) against sentence-transformers.

Given a small random-weight Llama / Qwen2 / Qwen3 / Mistral saved with save_pretrained,
with sentence-transformers files for last-token pooling and a tokenizer that appends
</s>, when Barge and sentence-transformers embed one batch of mixed-length texts with
the same prompt (an instruction), then every row agrees at cosine >= 0.9999 in fp32,
whichever side the reference pads on: Barge packs texts and never pads.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")

from engine import Engine  # noqa: E402
from engine.layers.fp8_linear import Fp8Linear  # noqa: E402
from tests.support import random_decoders  # noqa: E402
from tests.support.random_embedders import EOS_TOKEN_ID, save_random_llm_embedder  # noqa: E402

MIN_COSINE = 0.9999
MIN_FP8_COSINE = 0.99
MAX_SEQ_LENGTH = 96
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TEXTS = [
    "What is the capital of France?",
    "x",
    "Barges carry grain and coal along the river, through locks and past the harbour.",
    "",
    "the " * 200,                                  # truncated: </s> must still come last
    "How do canal locks work?",
]
# base_model: saved as the bare decoder under a *ForCausalLM architecture, as Qwen3-Embedding ships
FAMILIES = [("qwen3", True), ("llama", False), ("qwen2", False), ("mistral", True)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {family: save_random_llm_embedder(tmp_path_factory.mktemp(family), family, base_model=base_model,
                                             max_seq_length=MAX_SEQ_LENGTH, prompts={"query": INSTRUCTION})
            for family, base_model in FAMILIES}


def reference(folder, padding_side: str, **prompt) -> np.ndarray:
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    model.tokenizer.padding_side = padding_side
    return model.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, **prompt)


def barge(folder, **options) -> Engine:
    return Engine.from_pretrained(folder, mode="embed", device="cpu", max_batch_tokens=256, **options)


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("family", [family for family, _ in FAMILIES])
def test_last_token_embeddings_match_sentence_transformers(folders, family, padding_side):
    engine = barge(folders[family])
    ours = engine.embed(TEXTS, prompt=INSTRUCTION)
    theirs = reference(folders[family], padding_side, prompt=INSTRUCTION)
    cosines = (ours * theirs).sum(axis=1)
    print(f"{family} (reference padded {padding_side}): min cosine {cosines.min():.7f}")
    assert cosines.min() >= MIN_COSINE
    num_tokens = [output.num_tokens for output in engine.encode(TEXTS, prompt=INSTRUCTION)]
    assert max(num_tokens) == MAX_SEQ_LENGTH and len(set(num_tokens)) >= 4


def test_the_tokenizer_appends_eos_even_to_a_truncated_text(folders):
    engine = barge(folders["qwen3"])
    ids = engine._embedder.tokenizer.encode_batch(["hello", "the " * 200])
    assert [row[-1] for row in ids] == [EOS_TOKEN_ID, EOS_TOKEN_ID] and len(ids[1]) == MAX_SEQ_LENGTH


def test_a_named_prompt_is_the_same_as_its_text(folders):
    engine = barge(folders["qwen3"])
    by_name = engine.embed(TEXTS, prompt_name="query")
    assert np.allclose(by_name, engine.embed(TEXTS, prompt=INSTRUCTION), atol=1e-6)
    theirs = reference(folders["qwen3"], "left", prompt_name="query")
    assert (by_name * theirs).sum(axis=1).min() >= MIN_COSINE
    without = engine.embed(TEXTS)
    assert (without * reference(folders["qwen3"], "left")).sum(axis=1).min() >= MIN_COSINE
    assert (without * by_name).sum(axis=1).max() < 0.999         # the instruction changes the vectors


def test_bad_prompt_options_are_refused(folders):
    engine = barge(folders["qwen3"])
    with pytest.raises(ValueError, match="prompt_name 'passage' is not one of the model's prompts"):
        engine.embed(TEXTS, prompt_name="passage")
    with pytest.raises(ValueError, match="not both"):
        engine.encode(TEXTS, prompt=INSTRUCTION, prompt_name="query")
    with pytest.raises(ValueError, match="prompt must be a string"):
        engine.embed(TEXTS, prompt=42)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_fp8_linears_stay_close_to_fp32(tmp_path, monkeypatch, family):
    # The parity folders' wide init makes random weights chaotic; FP8 is judged on a usual one.
    monkeypatch.setitem(random_decoders.SMALL, "initializer_range", 0.02)
    folder = save_random_llm_embedder(tmp_path, family, base_model=family == "qwen3")
    fp8 = barge(folder, quantization="fp8")
    layer = fp8._embedder.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Fp8Linear) and isinstance(layer.mlp.gate_up_proj, Fp8Linear)
    cosines = (fp8.embed(TEXTS, prompt=INSTRUCTION) * barge(folder).embed(TEXTS, prompt=INSTRUCTION)).sum(axis=1)
    print(f"{family} fp8: min cosine {cosines.min():.5f}")
    assert cosines.min() >= MIN_FP8_COSINE
