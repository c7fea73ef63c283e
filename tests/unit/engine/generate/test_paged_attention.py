"""Decode attention over the paged KV cache: the compiled CPU kernel against plain
attention over each sequence's own K/V, and against the gather-and-matmul path it
replaces, including inside the engine."""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine.generate.attention import AttentionMetadata, DecodeGroup, paged_attention  # noqa: E402
from engine.generate.kv_cache import LayerKVCache  # noqa: E402
from engine.kernels import cpu_ops  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def built():
    assert cpu_ops.cpu_kernels_available(), "the CPU kernels did not build: is g++ installed?"


def _paged(num_kv_heads, head_dim, block_size, context_lens, generator):
    """A cache holding each sequence's K/V in shuffled blocks, and the same K/V unpaged."""
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = 1 + sum(blocks_per_seq)            # block 0 stays unused, as padding points at it
    k_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=generator)
    v_cache = torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=generator)
    order = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    table = torch.zeros(len(context_lens), max(blocks_per_seq), dtype=torch.long)
    for row, count in enumerate(blocks_per_seq):
        table[row, :count] = torch.tensor(order[:count])
        order = order[count:]
    return k_cache, v_cache, table


def _reference(q, k_cache, v_cache, table, context_lens, scale):
    outs = []
    for row, length in enumerate(context_lens):
        keys = k_cache[:, table[row]].flatten(1, 2)[:, :length]       # [kv_heads, length, dim]
        values = v_cache[:, table[row]].flatten(1, 2)[:, :length]
        out = F.scaled_dot_product_attention(q[row][:, None], keys, values, scale=scale, enable_gqa=True)
        outs.append(out[:, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", [
    (4, 4, 32, 4), (12, 4, 64, 16), (9, 3, 64, 16), (8, 1, 16, 8)])
def test_the_kernel_equals_attention_over_each_sequence_own_context(num_heads, num_kv_heads, head_dim, block_size):
    generator = torch.Generator().manual_seed(num_heads * 100 + block_size)
    context_lens = [300, 1, block_size, block_size + 1, 77, 2 * block_size, 5]
    k_cache, v_cache, table = _paged(num_kv_heads, head_dim, block_size, context_lens, generator)
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=generator)
    scale = head_dim ** -0.5
    out = cpu_ops.paged_decode(q, k_cache, v_cache, table, torch.tensor(context_lens), scale)
    torch.testing.assert_close(out, _reference(q, k_cache, v_cache, table, context_lens, scale),
                               atol=1e-5, rtol=1e-5)


def test_the_kernel_equals_the_gathering_path_inside_paged_attention():
    generator = torch.Generator().manual_seed(7)
    num_heads, num_kv_heads, head_dim, block_size = 12, 4, 64, 16
    context_lens = [130, 129, 64, 17, 3]
    k_cache, v_cache, table = _paged(num_kv_heads, head_dim, block_size, context_lens, generator)
    count = len(context_lens)
    q = torch.randn(count, num_heads, head_dim, generator=generator)
    k = torch.randn(count, num_kv_heads, head_dim, generator=generator)
    v = torch.randn(count, num_kv_heads, head_dim, generator=generator)
    # each new token goes to the last position of its context
    slots = torch.tensor([int(table[row, (n - 1) // block_size]) * block_size + (n - 1) % block_size
                          for row, n in enumerate(context_lens)])
    lens = torch.tensor(context_lens)
    is_real = torch.arange(table.shape[1] * block_size)[None, :] < lens[:, None]
    bias = torch.zeros(is_real.shape).masked_fill(~is_real, float("-inf"))
    gathered = paged_attention(q, k, v, LayerKVCache(k_cache.clone(), v_cache.clone()),
                               AttentionMetadata(slots, [DecodeGroup(0, table, lens, bias)], []), 0.125)
    compiled = paged_attention(q, k, v, LayerKVCache(k_cache.clone(), v_cache.clone()),
                               AttentionMetadata(slots, [DecodeGroup(0, table, lens, None)], []), 0.125)
    torch.testing.assert_close(compiled, gathered, atol=1e-5, rtol=1e-5)


def test_a_context_longer_than_its_block_table_is_refused():
    generator = torch.Generator().manual_seed(3)
    k_cache, v_cache, table = _paged(2, 16, 4, [8], generator)
    q = torch.randn(1, 2, 16)
    with pytest.raises(RuntimeError, match="does not fit the block table"):
        cpu_ops.paged_decode(q, k_cache, v_cache, table, torch.tensor([9]), 0.25)


def test_greedy_generation_is_the_same_with_the_kernel_and_without(tmp_path):
    pytest.importorskip("transformers")
    from engine import Engine, SamplingParams
    from tests.support.random_decoders import save_random_decoder

    engine = Engine.from_pretrained(save_random_decoder(tmp_path, "qwen2"), mode="generate",
                                    num_blocks=128, block_size=4)
    assert engine.llm.runner.use_cpu_kernel
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in (1, 7, 30, 61, 90)]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (24, 9, 16, 3, 20)]
    compiled = [output.token_ids for output in engine.generate(prompts, params)]
    engine.llm.runner.use_cpu_kernel = False
    gathered = [output.token_ids for output in engine.generate(prompts, params)]
    assert compiled == gathered
