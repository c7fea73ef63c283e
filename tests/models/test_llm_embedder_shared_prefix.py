"""LLM embedders behind an instruction prompt, the prompt's tokens run once (issue 47),
against the same rows run whole and against sentence-transformers on the same weights.

Given small random-weight decoders saved with the sentence-transformers files (last-token
pooling on a Qwen3, mean pooling on a Llama), when Barge embeds rows of different lengths
behind a prompt, then the vectors equal those of the rows run whole (cosine >= 0.99999 in
fp32) and sentence-transformers' encode(prompt=) (>= 0.9999): with a prompt whose last
token BPE merges with each text's first, and with a row whose tokens all lie in the
part every row shares.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip("transformers")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")

from engine import Engine  # noqa: E402
from engine.embed.batching import shared_prefix_length  # noqa: E402
from tests.support.random_embedders import save_random_llm_embedder, save_sentence_transformers_files  # noqa: E402

MIN_COSINE = 0.9999
MIN_SHARED_COSINE = 0.99999
MAX_SEQ_LENGTH = 96
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
# A trailing space: byte-level BPE puts it in the text's first token where the vocabulary
# has one (" What"), so the prompt's own tokens are not a prefix of every row.
MERGING_INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "
TEXTS = [
    "What is the capital of France?",
    "x",
    "Barges carry grain and coal along the river, through locks and past the harbour.",
    "",
    "the " * 200,                                  # truncated
    "How do canal locks work?",
    "What is a lock keeper?",
]
# pooling -> (family, saved as the bare decoder)
MODELS = {"lasttoken": ("qwen3", True), "mean": ("llama", False)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    folders = {}
    for pooling, (family, base_model) in MODELS.items():
        folder = save_random_llm_embedder(tmp_path_factory.mktemp(pooling), family, base_model=base_model,
                                          max_seq_length=MAX_SEQ_LENGTH)
        save_sentence_transformers_files(folder, 64, pooling, MAX_SEQ_LENGTH)
        folders[pooling] = folder
    return folders


def barge(folder) -> Engine:
    return Engine.from_pretrained(folder, mode="embed", device="cpu", max_batch_tokens=256)


def embed_both_ways(engine: Engine, texts: list[str], prompt: str) -> tuple[np.ndarray, np.ndarray]:
    """(the prefix run once, every row run whole)"""
    embedder = engine._embedder
    shared = engine.embed(texts, prompt=prompt)
    assert embedder.last_call.num_shared_prefix_tokens > 0, "the rows shared no prefix"
    embedder.share_prompt_prefix = False
    try:
        whole = engine.embed(texts, prompt=prompt)
    finally:
        embedder.share_prompt_prefix = True
    return shared, whole


def reference(folder, texts: list[str], prompt: str) -> np.ndarray:
    model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    return model.encode(texts, batch_size=len(texts), convert_to_numpy=True, prompt=prompt)


def check(folder, texts: list[str], prompt: str, label: str) -> None:
    shared, whole = embed_both_ways(barge(folder), texts, prompt)
    to_whole = (shared * whole).sum(axis=1)
    to_reference = (shared * reference(folder, texts, prompt)).sum(axis=1)
    print(f"{label}: min cosine to whole rows {to_whole.min():.8f}, to sentence-transformers {to_reference.min():.8f}")
    assert to_whole.min() >= MIN_SHARED_COSINE
    assert to_reference.min() >= MIN_COSINE


@pytest.mark.parametrize("prompt", [INSTRUCTION, MERGING_INSTRUCTION], ids=["instruction", "merging"])
@pytest.mark.parametrize("pooling", list(MODELS))
def test_the_prefix_run_once_gives_the_vectors_of_whole_rows(folders, pooling, prompt):
    check(folders[pooling], TEXTS, prompt, f"{pooling}, {prompt[-7:]!r}")


def test_a_merging_prompt_is_shared_up_to_where_the_rows_part(folders):
    engine = barge(folders["lasttoken"])
    tokenizer = engine._embedder.tokenizer
    prompt_ids = tokenizer.encode_batch([MERGING_INSTRUCTION])[0][:-1]          # less the </s> it appends
    token_ids = tokenizer.encode_batch([MERGING_INSTRUCTION + text for text in TEXTS if text])
    # This small vocabulary has " What" and " the" but not " x" or " H": the space merges with some texts.
    assert not all(ids[:len(prompt_ids)] == prompt_ids for ids in token_ids), "the space merges with no text"
    engine.embed([text for text in TEXTS if text], prompt=MERGING_INSTRUCTION)
    assert engine._embedder.last_call.num_prefix_tokens == shared_prefix_length(token_ids) == len(prompt_ids) - 1


@pytest.mark.parametrize("pooling", list(MODELS))
def test_a_row_no_longer_than_the_shared_part_keeps_its_last_token(folders, tmp_path, pooling):
    # Given a tokenizer that adds nothing after the text (it prefixes <s>), so the empty
    # text's row is the prompt alone: every row shares all of it but the last token.
    from tokenizers import Tokenizer, processors

    folder = tmp_path / pooling
    family, base_model = MODELS[pooling]
    save_random_llm_embedder(folder, family, base_model=base_model, max_seq_length=MAX_SEQ_LENGTH)
    save_sentence_transformers_files(folder, 64, pooling, MAX_SEQ_LENGTH)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))
    engine = barge(folder)
    token_ids = engine._embedder.tokenizer.encode_batch([INSTRUCTION + text for text in TEXTS])
    assert shared_prefix_length(token_ids) == len(token_ids[TEXTS.index("")]) - 1
    # Then
    check(folder, TEXTS, INSTRUCTION, f"{pooling}, the prompt alone as a row")


@pytest.mark.parametrize("pooling", list(MODELS))
def test_the_fused_layers_behind_a_prefix_match_whole_rows(folders, pooling):
    # The fused kernels on the layers' other ops (CUDA's path), attention behind the prefix by SDPA.
    pytest.importorskip("triton")
    import torch
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    engine = Engine.from_pretrained(folders[pooling], mode="embed", dtype="float32",
                                    device="cuda" if torch.cuda.is_available() else "cpu")
    engine._embedder.model.fused_ops = True
    texts = TEXTS[:4]               # the interpreter is slow
    shared, whole = embed_both_ways(engine, texts, INSTRUCTION)
    assert (shared * whole).sum(axis=1).min() >= MIN_SHARED_COSINE
    engine._embedder.model.fused_ops = False
    assert (shared * engine.embed(texts, prompt=INSTRUCTION)).sum(axis=1).min() >= MIN_SHARED_COSINE
