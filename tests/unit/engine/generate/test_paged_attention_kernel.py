"""The Triton paged-attention kernel against the gather path it replaces on CUDA
(engine/generate/attention.py's DecodeGroup / PrefillChunk), on whatever device the
machine has: CUDA tensors and the compiled kernel on a GPU, Triton's interpreter on CPU
(tests/conftest.py sets TRITON_INTERPRET=1 there). Tiny shapes: the interpreter is slow."""

import os

import pytest
import torch

pytest.importorskip("triton")

from engine.generate.attention import AttentionMetadata, DecodeGroup, PrefillChunk  # noqa: E402
from engine.generate.attention import paged_attention as gather_attention  # noqa: E402
from engine.generate.kv_cache import LayerKVCache, dequantize_rows, quantize_rows, store_kv  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def kernel():
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels import paged_attention
    return paged_attention


class Batch:
    """Sequences given as (num_cached, num_new): their blocks shuffled through a random cache,
    the new tokens' q/k/v, and both kinds of metadata over the same slots."""

    def __init__(self, seqs, num_heads, num_kv_heads, head_dim, block_size, dtype, seed=0):
        generator = torch.Generator().manual_seed(seed)
        lens = [cached + new for cached, new in seqs]
        blocks_per_seq = [-(-n // block_size) for n in lens]
        num_blocks = 1 + sum(blocks_per_seq)      # block 0 left over: table padding points at it
        self.k_cache, self.v_cache = (torch.randn(num_kv_heads, num_blocks, block_size, head_dim, generator=generator)
                                      .to(DEVICE, dtype) for _ in range(2))
        order = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
        self.tables = []
        for count in blocks_per_seq:
            self.tables.append(order[:count])
            order = order[count:]
        num_tokens = sum(new for _, new in seqs)
        self.q = torch.randn(num_tokens, num_heads, head_dim, generator=generator).to(DEVICE, dtype)
        self.k, self.v = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator).to(DEVICE, dtype)
                          for _ in range(2))
        self.seqs, self.lens, self.block_size = seqs, lens, block_size
        slots = [table[p // block_size] * block_size + p % block_size
                 for table, (cached, new) in zip(self.tables, seqs) for p in range(cached, cached + new)]
        self.slot_mapping = torch.tensor(slots, dtype=torch.long, device=DEVICE)

    def flat(self):
        starts = torch.tensor([0, *torch.tensor([new for _, new in self.seqs]).cumsum(0).tolist()], dtype=torch.int32)
        width = max(len(t) for t in self.tables) + 1        # a spare column: the kernel must not read it
        tables = torch.zeros(len(self.tables), width, dtype=torch.int32)
        for row, table in enumerate(self.tables):
            tables[row, :len(table)] = torch.tensor(table)
        return (starts.to(DEVICE), torch.tensor(self.lens, dtype=torch.int32, device=DEVICE), tables.to(DEVICE),
                max(new for _, new in self.seqs))

    def gather_metadata(self, always_gather=False):
        """What the CPU runner builds without its compiled kernel: decode groups with a bias,
        prefill chunks with a mask after cached tokens (decodes come first in the batch);
        always_gather: first chunks read the cache too (the runner's rule for an fp8 cache)."""
        decodes, prefills, start = [], [], 0
        for (cached, new), table, length in zip(self.seqs, self.tables, self.lens):
            block_ids = torch.tensor(table, dtype=torch.long, device=DEVICE)
            if new == 1:
                is_real = torch.arange(len(table) * self.block_size, device=DEVICE)[None, :] < length
                bias = torch.zeros(is_real.shape, device=DEVICE).masked_fill(~is_real, float("-inf"))
                decodes.append(DecodeGroup(start, block_ids[None], torch.tensor([length], device=DEVICE),
                                           bias.to(self.q.dtype)))
            elif cached == 0 and not always_gather:
                prefills.append(PrefillChunk(start, new, None, 0, None))
            else:
                mask = (torch.arange(length, device=DEVICE)[None, :]
                        <= torch.arange(cached, length, device=DEVICE)[:, None])
                prefills.append(PrefillChunk(start, new, block_ids, length, mask))
            start += new
        return AttentionMetadata(self.slot_mapping, decodes, prefills)


def run_both(kernel, batch, scale=0.25, block_n=None):
    expected = gather_attention(batch.q, batch.k, batch.v, LayerKVCache(batch.k_cache.clone(), batch.v_cache.clone()),
                                batch.gather_metadata(), scale)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    num_kv_heads, head_dim = k_cache.shape[0], k_cache.shape[-1]
    k_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, batch.slot_mapping, batch.k.transpose(0, 1))
    v_cache.view(num_kv_heads, -1, head_dim).index_copy_(1, batch.slot_mapping, batch.v.transpose(0, 1))
    ours = kernel.paged_attention(batch.q, k_cache, v_cache, *batch.flat(), scale, block_n=block_n)
    return ours, expected


def max_error(ours, expected):
    return (ours.float() - expected.float()).abs().max().item()


@pytest.mark.parametrize("block_size", [4, 16])
def test_decodes_at_block_boundaries(kernel, block_size):
    """Contexts of 1, block_size, block_size + 1 and a few blocks, one new token each."""
    seqs = [(0, 1), (block_size - 1, 1), (block_size, 1), (3 * block_size + 2, 1), (40, 1)]
    ours, expected = run_both(kernel, Batch(seqs, 4, 2, 16, block_size, torch.float32, seed=block_size))
    assert ours.shape == expected.shape
    assert max_error(ours, expected) <= 1e-5


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(4, 4, 16), (4, 2, 32), (6, 2, 16), (4, 1, 24),
                                                               (8, 2, 128)])    # the 8B shape's head and group
def test_decodes_and_prefill_chunks_in_one_batch(kernel, num_heads, num_kv_heads, head_dim):
    """Decodes, a first chunk, and chunks after cached prefix tokens (a prefix hit or an
    earlier chunk), with plain heads, grouped-query heads (3 per kv head: not a power of
    two) and an odd head_dim padded inside the kernel."""
    seqs = [(9, 1), (0, 1), (0, 7), (8, 5), (4, 1), (5, 20), (16, 17)]
    ours, expected = run_both(kernel, Batch(seqs, num_heads, num_kv_heads, head_dim, 8, torch.float32,
                                            seed=num_heads + head_dim))
    assert max_error(ours, expected) <= 1e-5


def test_prefill_only_with_narrow_key_tiles(kernel):
    """Key tiles of 16 over blocks of 4: each tile spans four blocks of the table."""
    seqs = [(0, 33), (12, 3), (3, 30)]
    ours, expected = run_both(kernel, Batch(seqs, 4, 2, 16, 4, torch.float32, seed=3), block_n=16)
    assert max_error(ours, expected) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_caches(kernel, dtype):
    """The reference rounds its softmax weights to the 16-bit type before the value
    matmul, the kernel keeps fp32 weights: they differ by a few units of the type's
    precision on outputs of order 1 (bf16 8 bits of mantissa, ~4e-3 per ulp)."""
    seqs = [(17, 1), (0, 1), (8, 9), (0, 12)]
    ours, expected = run_both(kernel, Batch(seqs, 4, 2, 32, 8, dtype, seed=11))
    assert ours.dtype == dtype
    assert max_error(ours, expected) <= (4e-2 if dtype == torch.bfloat16 else 5e-3)


def test_padding_rows_of_a_graph_bucket_write_zeros_and_touch_nothing_else(kernel):
    """A sequence with seq_len 0 (a padded row of a CUDA graph bucket) attends to nothing:
    its output is zero, the other rows are as without it."""
    batch = Batch([(5, 1), (12, 1)], 4, 2, 16, 4, torch.float32, seed=5)
    ours, _ = run_both(kernel, batch)
    starts, seq_lens, tables, _ = batch.flat()
    padded_starts = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=DEVICE)
    padded_lens = torch.cat([seq_lens, torch.zeros(1, dtype=torch.int32, device=DEVICE)])
    padded_tables = torch.cat([tables, torch.zeros_like(tables[:1])])
    q = torch.cat([batch.q, torch.randn_like(batch.q[:1])])
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    k_cache.view(2, -1, 16).index_copy_(1, batch.slot_mapping, batch.k.transpose(0, 1))
    v_cache.view(2, -1, 16).index_copy_(1, batch.slot_mapping, batch.v.transpose(0, 1))
    padded = kernel.paged_attention(q, k_cache, v_cache, padded_starts, padded_lens, padded_tables, 1, 0.25)
    assert torch.equal(padded[:2], ours)
    assert torch.equal(padded[2], torch.zeros_like(padded[2]))


def test_refuses_what_it_cannot_run(kernel):
    batch = Batch([(0, 2)], 3, 2, 16, 4, torch.float32)
    with pytest.raises(ValueError, match="num_kv_heads"):
        kernel.paged_attention(batch.q, batch.k_cache, batch.k_cache, *batch.flat(), 0.25)


def fp8_caches(batch):
    """The batch's cache in E4M3 with a scale per slot and kv head (kv_cache_dtype="fp8")."""
    (k, k_scale), (v, v_scale) = quantize_rows(batch.k_cache), quantize_rows(batch.v_cache)
    return LayerKVCache(k, v, k_scale, v_scale)


def run_fp8(kernel, batch, scale=0.25, block_n=None):
    """The kernel over an fp8 cache the store wrote the new tokens to; the native path over
    the same fp8 cache; and the reference: the gather path over those values dequantized,
    every chunk reading the cache (as the runner builds chunks for an fp8 cache)."""
    cache = fp8_caches(batch)
    store_kv(cache, batch.k, batch.v, batch.slot_mapping)
    ours = kernel.paged_attention(batch.q, cache.k, cache.v, *batch.flat(), scale, block_n=block_n,
                                  k_scale=cache.k_scale, v_scale=cache.v_scale)
    native = gather_attention(batch.q, batch.k, batch.v, fp8_caches(batch), batch.gather_metadata(True), scale)
    dequantized = LayerKVCache(dequantize_rows(cache.k, cache.k_scale, torch.float32),
                               dequantize_rows(cache.v, cache.v_scale, torch.float32))
    k_stored, v_stored = (dequantize_rows(*quantize_rows(x), torch.float32) for x in (batch.k, batch.v))
    expected = gather_attention(batch.q.float(), k_stored, v_stored, dequantized, batch.gather_metadata(True), scale)
    return ours, native, expected


@pytest.mark.parametrize("block_size", [4, 16])
def test_fp8_cache_decodes_at_block_boundaries(kernel, block_size):
    seqs = [(0, 1), (block_size - 1, 1), (block_size, 1), (3 * block_size + 2, 1), (40, 1)]
    ours, native, expected = run_fp8(kernel, Batch(seqs, 4, 2, 16, block_size, torch.float32, seed=block_size))
    assert ours.shape == expected.shape
    assert max_error(ours, expected) <= 1e-5 and max_error(native, expected) <= 1e-5


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(4, 4, 16), (6, 2, 16), (4, 1, 24), (8, 2, 128)])
def test_fp8_cache_decodes_and_prefill_chunks_in_one_batch(kernel, num_heads, num_kv_heads, head_dim):
    """Decodes, first chunks and chunks after cached tokens, GQA of 3 and 4, an odd head_dim:
    the kernel reading E4M3 + scales computes what fp32 attention over the dequantized
    values computes (it widens exactly and scales the score and probability columns)."""
    seqs = [(9, 1), (0, 1), (0, 7), (8, 5), (4, 1), (5, 20), (16, 17)]
    ours, native, expected = run_fp8(kernel, Batch(seqs, num_heads, num_kv_heads, head_dim, 8, torch.float32,
                                                   seed=num_heads + head_dim))
    assert max_error(ours, expected) <= 1e-5 and max_error(native, expected) <= 1e-5


def test_fp8_cache_with_narrow_key_tiles(kernel):
    ours, native, expected = run_fp8(kernel, Batch([(0, 33), (12, 3), (3, 30)], 4, 2, 16, 4, torch.float32, seed=3),
                                     block_n=16)
    assert max_error(ours, expected) <= 1e-5 and max_error(native, expected) <= 1e-5


@pytest.mark.parametrize("dtype, v_magnitude, tolerance", [(torch.bfloat16, 1.0, 4e-2), (torch.float16, 1.0, 5e-3),
                                                          (torch.float16, 1e-4, 5e-3)])
def test_fp8_cache_under_16_bit_compute(kernel, dtype, v_magnitude, tolerance):
    """E4M3 widens exactly to 16 bits; the 16-bit products and the reference's 16-bit softmax
    weights differ by a few ulps on outputs of order 1, as for a 16-bit cache. Values of
    1e-4 in fp16 (scales ~2e-7): V is dequantized before the product, so nothing underflows
    (with its scales folded into fp16 probabilities the error was 0.19 of the output)."""
    batch = Batch([(17, 1), (0, 1), (8, 9), (0, 12), (40, 1)], 4, 2, 32, 8, dtype, seed=11)
    batch.v_cache, batch.v = batch.v_cache * v_magnitude, batch.v * v_magnitude
    ours, native, expected = run_fp8(kernel, batch)
    assert ours.dtype == dtype
    assert max_error(ours, expected) <= tolerance * v_magnitude and max_error(native, expected) <= tolerance * v_magnitude


def test_refuses_an_fp8_cache_without_both_scales(kernel):
    batch = Batch([(0, 2)], 4, 2, 16, 4, torch.float32)
    cache = fp8_caches(batch)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        kernel.paged_attention(batch.q, cache.k, cache.v, *batch.flat(), 0.25, k_scale=cache.k_scale)
