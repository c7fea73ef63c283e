"""Attention over the paged KV cache in place: one Triton kernel for decode tokens and
prefill chunks alike (tested on CPU with TRITON_INTERPRET=1 against the gather path of
engine/generate/attention.py).

The batch is flat; query_start_loc int32 [num_seqs + 1] says where each sequence's new
tokens lie, seq_lens int32 [num_seqs] how long its context is with them, and
block_tables int32 [num_seqs, max_num_blocks] where that context lies in the cache:

    q rows          | d0 | d1 | p p p p | p p |      d = decode token, p = prefill chunk
    query_start_loc 0    1    2         6     8
    seq_lens          37   5     4+16    2          (the third chunk follows 16 cached tokens)
    cache           [num_kv_heads, num_blocks, block_size, head_dim], K and V apart
    (fp8)           E4M3, with fp32 scales [num_kv_heads, num_blocks, block_size] beside them
    grid            (num_seqs, query tiles of max_query_len, num_kv_heads)

NOTE: a program takes one kv head and a tile of BLOCK_Q query tokens; its rows are those
tokens times the GROUP_SIZE query heads that share the kv head, so each K/V row is read
from the cache once for all of them (no repeat_kv, no gather, no padding to the longest
context). A decode token of a 4:1 GQA model thus fills 4 rows of a 16-row tile, where a
program per query head would fill 1. Query token i of a sequence with query_len new tokens
sits at position seq_len - query_len + i and sees keys 0..that position, which covers
decodes (query_len 1), first chunks and chunks after cached prefix tokens in one rule.
Keys are visited BLOCK_N at a time, each key's block looked up in the block table, so
block_size need not be a power of two nor as large as a tl.dot tile. Softmax is online
in fp32. A sequence with seq_len 0 (a padding row of a CUDA graph bucket) writes zeros.

With an fp8 cache (KV_FP8, a constexpr: the 16-bit kernel is compiled without it), K and
V are loaded as E4M3 (half the bytes of bf16) and widened in registers. K widens to q's
dtype exactly and its per-slot scales multiply the fp32 score columns, BLOCK_M x BLOCK_N
multiplies. V is dequantized in fp32 (value x scale) and then narrowed: folding its scales
into the probabilities instead would underflow fp16 for rows of small scale (p x 1e-7 is
below fp16's smallest subnormal), and the outputs of such rows lost ~20 % in a test.

The shapes the grid depends on (num_seqs, max_query_len) come from the host; no value is
read back from the device, so a CUDA graph can hold the call with fixed metadata buffers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.precision import dot_in_fp32

MAX_HEAD_DIM = 256


@triton.jit
def _paged_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, out_ptr,
                            query_start_loc_ptr, seq_lens_ptr, block_tables_ptr, scale, head_dim, block_size,
                            stride_qt, stride_qh, stride_ot, stride_oh,
                            stride_kh, stride_kb, stride_ks, stride_vh, stride_vb, stride_vs, stride_bt,
                            stride_sh, stride_sb, stride_ss,
                            GROUP_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_FP32: tl.constexpr,
                            KV_FP8: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(2).to(tl.int64)     # kv_head * stride_kh passes 2**31 in a large cache
    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    q_tile_start = tl.program_id(1) * BLOCK_Q
    if q_tile_start >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    num_cached = seq_len - query_len
    # row r of the tile: query token q_tile_start + r // GROUP_SIZE, query head kv_head * GROUP_SIZE + r % GROUP_SIZE
    offs_m = tl.arange(0, BLOCK_M)
    token = q_tile_start + offs_m // GROUP_SIZE
    head = kv_head * GROUP_SIZE + offs_m % GROUP_SIZE
    row_mask = (offs_m < BLOCK_Q * GROUP_SIZE) & (token < query_len)
    offs_d = tl.arange(0, HEAD_DIM)                   # HEAD_DIM: head_dim rounded up to a power of two
    d_mask = offs_d[None, :] < head_dim
    q = tl.load(q_ptr + (query_start + token[:, None]) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None] & d_mask, other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    qk_scale = scale * 1.4426950408889634              # exp(x) = exp2(x * log2(e))
    position = num_cached + token                      # each row's place in its sequence
    # A finite floor, not -inf: a row with every key of a tile masked keeps m_i, and
    # exp2(m_i - m_new) stays exp2(0) instead of exp2(-inf + inf) = nan.
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    # causal: the tile's last token sees the most keys
    hi = tl.minimum(seq_len, num_cached + q_tile_start + BLOCK_Q)
    for n_start in range(0, hi, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        block = tl.load(block_tables_ptr + seq * stride_bt + offs_n // block_size, mask=n_mask, other=0)
        slot = block.to(tl.int64) * stride_kb + (offs_n % block_size) * stride_ks
        kv_mask = n_mask[:, None] & d_mask
        k = tl.load(k_cache_ptr + kv_head * stride_kh + slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v_slot = block.to(tl.int64) * stride_vb + (offs_n % block_size) * stride_vs
        v = tl.load(v_cache_ptr + kv_head * stride_vh + v_slot[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if KV_FP8:  # E4M3 widens exactly; K's scales multiply score columns, V is dequantized in fp32
            scale_slot = kv_head * stride_sh + block.to(tl.int64) * stride_sb + (offs_n % block_size) * stride_ss
            k_scale = tl.load(k_scale_ptr + scale_slot, mask=n_mask, other=0.0)
            v_scale = tl.load(v_scale_ptr + scale_slot, mask=n_mask, other=0.0)
            k = k.to(q.dtype)
            v = (v.to(tl.float32) * v_scale[:, None]).to(q.dtype)
        if DOT_FP32:    # no silent TF32: fp32 results must match the reference
            qk = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        if KV_FP8:
            qk = qk * k_scale[None, :]
        allowed = n_mask[None, :] & (offs_n[None, :] <= position[:, None])
        qk = tl.where(allowed, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + (query_start + token[:, None]) * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask)


def _tiles(max_query_len: int, group_size: int, head_dim: int) -> tuple[int, int, int]:
    """BLOCK_Q query tokens per program, its BLOCK_M rows (>= 16 for tl.dot), BLOCK_N keys per step."""
    rows_limit = 64 if head_dim <= 128 else 32
    block_q = max(1, min(triton.next_power_of_2(max_query_len), rows_limit // triton.next_power_of_2(group_size)))
    block_m = max(16, triton.next_power_of_2(block_q * group_size))
    block_n = 32 if head_dim <= 128 else 16
    return block_q, block_m, block_n


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                    seq_lens: torch.Tensor, block_tables: torch.Tensor, max_query_len: int, scale: float,
                    out: torch.Tensor | None = None, block_n: int | None = None,
                    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim] (the new tokens, their K/V already in the cache),
    k_cache/v_cache [num_kv_heads, num_blocks, block_size, head_dim] -> [num_tokens, num_heads, head_dim].

    query_start_loc int32 [num_seqs + 1], seq_lens int32 [num_seqs] (context incl. new tokens),
    block_tables int32 [num_seqs, max_num_blocks], all on q's device; max_query_len the most
    new tokens of any sequence (a host int: it sizes the grid). out: where to write (a graph's buffer).
    k_scale/v_scale fp32 [num_kv_heads, num_blocks, block_size]: the cache is E4M3 and these
    are its per-slot scales (engine/generate/kv_cache.py); None for a 16/32-bit cache.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be at most {MAX_HEAD_DIM} for the paged attention kernel, got {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the KV cache's head_dim must be contiguous")
    is_fp8 = k_scale is not None
    if is_fp8 and (v_scale is None or k_scale.stride() != v_scale.stride()):
        raise ValueError("an fp8 KV cache needs k_scale and v_scale of the same layout")
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    group_size = num_heads // num_kv_heads
    block_q, block_m, default_block_n = _tiles(max_query_len, group_size, head_dim)
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, k_scale if is_fp8 else k_cache, v_scale if is_fp8 else v_cache, out,
        query_start_loc, seq_lens, block_tables, scale, head_dim, k_cache.shape[2],
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), block_tables.stride(0), *(k_scale.stride() if is_fp8 else (0, 0, 0)),
        GROUP_SIZE=group_size, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=block_n or default_block_n,
        HEAD_DIM=max(16, triton.next_power_of_2(head_dim)), DOT_FP32=dot_in_fp32(q.dtype), KV_FP8=is_fp8)
    return out
