"""Flash attention's forward pass over packed texts (no padding), beside the PyTorch reference
it is tested against (on CPU with TRITON_INTERPRET=1, on GPU by bench/fp8_bench.py).

A batch is its texts laid end to end (engine/embed/batching.py); cu_seqlens int32 [num_seqs + 1]
gives where each text starts, so text s is rows cu_seqlens[s]:cu_seqlens[s + 1]:

    q rows       | a a a | b b b b b | c c |
    cu_seqlens   0       3           8     10
    grid         (num_seqs, query blocks of max_seqlen, num_heads); a program whose query
                 block lies past its text's end returns at once

A query attends to the keys of its own text only, limited further by `causal` (j <= i) and
`half_window` (|i - j| <= half_window, ModernBERT's local layers); the key loop visits only
the blocks those limits leave. Softmax is online in fp32 (running max and sum per row).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kernels.precision import dot_in_fp32

MAX_HEAD_DIM = 128


@triton.jit
def _varlen_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cu_seqlens_ptr, scale, half_window, head_dim,
                             stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                             GROUP_SIZE: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                             DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             HEAD_DIM: tl.constexpr):
    seq, head = tl.program_id(0), tl.program_id(2)
    seq_start = tl.load(cu_seqlens_ptr + seq)
    seq_len = tl.load(cu_seqlens_ptr + seq + 1) - seq_start
    m_start = tl.program_id(1) * BLOCK_M
    if m_start >= seq_len:
        return
    kv_head = head // GROUP_SIZE
    offs_m = m_start + tl.arange(0, BLOCK_M)          # positions inside the text
    offs_d = tl.arange(0, HEAD_DIM)                   # HEAD_DIM: head_dim rounded up to a power of two
    d_mask = offs_d[None, :] < head_dim
    q = tl.load(q_ptr + (seq_start + offs_m[:, None]) * stride_qt + head * stride_qh + offs_d[None, :],
                mask=(offs_m[:, None] < seq_len) & d_mask, other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    qk_scale = scale * 1.4426950408889634              # exp(x) = exp2(x * log2(e))
    # A finite floor, not -inf: a row whose keys in one block are all masked keeps m_i, and
    # exp2(m_i - m_new) stays exp2(0) instead of exp2(-inf + inf) = nan.
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    lo = 0
    hi = seq_len
    if CAUSAL:
        hi = tl.minimum(hi, m_start + BLOCK_M)
    if HAS_WINDOW:
        lo = tl.maximum(0, m_start - half_window)
        hi = tl.minimum(hi, m_start + BLOCK_M + half_window)
    for n_start in range(lo, hi, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < seq_len) & d_mask
        k = tl.load(k_ptr + (seq_start + offs_n[:, None]) * stride_kt + kv_head * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + (seq_start + offs_n[:, None]) * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        if DOT_FP32:    # no silent TF32: fp32 results must match the reference
            qk = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        allowed = offs_n[None, :] < seq_len
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
        if HAS_WINDOW:
            distance = offs_m[:, None] - offs_n[None, :]
            allowed = allowed & (distance <= half_window) & (distance >= -half_window)
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
    tl.store(out_ptr + (seq_start + offs_m[:, None]) * stride_ot + head * stride_oh + offs_d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < seq_len) & d_mask)


def _block_size(max_seqlen: int, head_dim: int) -> int:
    # tl.dot needs at least 16 rows; short texts should not pay for 64-row tiles of padding.
    limit = 64 if head_dim <= 64 else 32
    return min(limit, max(16, triton.next_power_of_2(max_seqlen)))


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     causal: bool = False, half_window: int | None = None, softmax_scale: float | None = None,
                     block_m: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] (strided views
    are fine if the last dim is contiguous) -> [num_tokens, num_heads, head_dim] in q's dtype.

    cu_seqlens int32 [num_seqs + 1] on q's device; max_seqlen the longest text; softmax_scale
    defaults to 1 / sqrt(head_dim); block_m / block_n (powers of two >= 16) override the tiles.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be at most {MAX_HEAD_DIM} for the varlen attention kernel, got {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if half_window is not None and half_window < 0:
        raise ValueError(f"half_window must be >= 0, got {half_window}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=q.dtype, device=q.device)
    num_seqs = cu_seqlens.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_m = block_m or _block_size(max_seqlen, head_dim)
    block_n = block_n or _block_size(max_seqlen, head_dim)
    # Texts on the first grid axis: it alone may exceed 65535 (a batch of many short texts).
    grid = (num_seqs, triton.cdiv(max_seqlen, block_m), num_heads)
    _varlen_attention_kernel[grid](
        q, k, v, out, cu_seqlens, softmax_scale or 1.0 / math.sqrt(head_dim), half_window or 0, head_dim,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        GROUP_SIZE=num_heads // num_kv_heads, CAUSAL=causal, HAS_WINDOW=half_window is not None,
        DOT_FP32=dot_in_fp32(q.dtype), BLOCK_M=block_m, BLOCK_N=block_n,
        HEAD_DIM=max(16, triton.next_power_of_2(head_dim)))
    return out


def reference_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                               causal: bool = False, half_window: int | None = None,
                               softmax_scale: float | None = None) -> torch.Tensor:
    """The same, one text at a time through SDPA in fp32 with its mask written out in full."""
    group_size = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        positions = torch.arange(end - start, device=q.device)
        allowed = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device)
        if causal:
            allowed &= positions[:, None] >= positions[None, :]
        if half_window is not None:
            allowed &= (positions[:, None] - positions[None, :]).abs() <= half_window
        # [seq_len, heads, head_dim] -> [heads, seq_len, head_dim], kv heads repeated for GQA
        qs, ks, vs = (x[start:end].float().repeat_interleave(repeats, dim=1).transpose(0, 1)
                      for x, repeats in ((q, 1), (k, group_size), (v, group_size)))
        attended = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, scale=softmax_scale)
        out[start:end] = attended.transpose(0, 1).to(q.dtype)
    return out
