"""The Triton varlen attention kernel against one-text-at-a-time SDPA, run by Triton's
interpreter on CPU (TRITON_INTERPRET=1) on tiny shapes: the interpreter is slow."""

import os

import pytest
import torch

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEQ_LENS = [1, 7, 16, 17, 40]       # one token, under, at and over a 16-row tile, several key tiles
TILE = 16                           # small tiles, so a 40-token text crosses three key blocks


@pytest.fixture(scope="module")
def kernel():
    # tests/conftest.py turns the interpreter on before triton is imported, on CPU machines.
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and TRITON_INTERPRET is not 1")
    from engine.kernels import varlen_attention
    return varlen_attention


def packed_qkv(seq_lens, num_heads, num_kv_heads, head_dim, dtype=torch.float32):
    generator = torch.Generator().manual_seed(sum(seq_lens) + num_heads + head_dim)
    num_tokens = sum(seq_lens)
    q, k, v = (torch.randn(num_tokens, heads, head_dim, generator=generator).to(DEVICE, dtype)
               for heads in (num_heads, num_kv_heads, num_kv_heads))
    cu_seqlens = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    return q, k, v, cu_seqlens


def max_error(ours, expected):
    return (ours.float() - expected.float()).abs().max().item()


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, causal, half_window", [
    (2, 2, 16, False, None),      # BERT: bidirectional
    (4, 4, 32, False, None),
    (4, 2, 16, True, None),       # LLM embedder: causal, grouped-query
    (2, 2, 32, False, 5),         # ModernBERT local layer
    (4, 1, 16, True, 3),          # both limits, one kv head for all
])
def test_fp32_matches_the_reference(kernel, num_heads, num_kv_heads, head_dim, causal, half_window):
    q, k, v, cu_seqlens = packed_qkv(SEQ_LENS, num_heads, num_kv_heads, head_dim)
    ours = kernel.varlen_attention(q, k, v, cu_seqlens, max(SEQ_LENS), causal, half_window,
                                   block_m=TILE, block_n=TILE)
    expected = kernel.reference_varlen_attention(q, k, v, cu_seqlens, causal, half_window)
    assert ours.dtype == q.dtype and ours.shape == q.shape
    assert max_error(ours, expected) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_matches_the_fp32_reference(kernel, dtype):
    q, k, v, cu_seqlens = packed_qkv(SEQ_LENS, 4, 2, 16, dtype)
    ours = kernel.varlen_attention(q, k, v, cu_seqlens, max(SEQ_LENS), causal=True, block_m=TILE, block_n=TILE)
    expected = kernel.reference_varlen_attention(q, k, v, cu_seqlens, causal=True)
    assert ours.dtype == dtype
    assert max_error(ours, expected) <= (1e-2 if dtype == torch.float16 else 3e-2)


def test_default_tiles_odd_head_dim_scale_and_strided_views(kernel):
    """head_dim 24 is padded to 32 inside the kernel; q/k/v are views of one fused projection."""
    seq_lens, num_heads, head_dim = [3, 20], 2, 24
    generator = torch.Generator().manual_seed(3)
    qkv = torch.randn(sum(seq_lens), 3 * num_heads * head_dim, generator=generator).to(DEVICE)
    q, k, v = qkv.view(-1, 3, num_heads, head_dim).unbind(1)
    cu_seqlens = torch.tensor([0, 3, 23], dtype=torch.int32, device=DEVICE)
    ours = kernel.varlen_attention(q, k, v, cu_seqlens, 20, softmax_scale=0.3)
    expected = kernel.reference_varlen_attention(q, k, v, cu_seqlens, softmax_scale=0.3)
    assert max_error(ours, expected) <= 1e-4


def test_refuses_what_it_cannot_run(kernel):
    q, k, v, cu_seqlens = packed_qkv([2], 3, 2, 16)
    with pytest.raises(ValueError, match="num_kv_heads"):
        kernel.varlen_attention(q, k, v, cu_seqlens, 2)
    big = torch.zeros(2, 1, 256, device=DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        kernel.varlen_attention(big, big, big, cu_seqlens, 2)
