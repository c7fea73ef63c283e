"""The grouped LoRA shrink and expand as two Triton kernels, for every adapter of a step at once.

    shrink:  t[p, :]        = x[sorted_rows[p], :] @ A[slot]^T            p: a token's place in slot order
    expand:  y[row, cols]  += (t[p, sub] @ B_sub[slot]^T) * scale[slot]    row = sorted_rows[p]

    grid:    (token tiles, column tiles, max_loras)   program (i, j, s): tile i of slot s's tokens

NOTE: the segmented idea of punica's SGMV (as vLLM and S-LoRA use it), written for this
layout: the third grid axis is the slot, and a program whose tile lies past its slot's
token count (slot_starts) returns at once, so the grid is fixed by the step's size and
max_loras alone — nothing is read back to the host, and base tokens (slot -1) are in no
slot's list, so they cost nothing. Every slot's A is padded with zero rows to the table's
rank R (a power of two >= 16: tl.dot's smallest tile), so one launch serves adapters of
any ranks; fused q|k|v (or gate|up) share one shrink, t holding each projection's R
columns side by side, and get one expand each. t is fp32 (PEFT rounds it to the
activation dtype; keeping it wider changes bf16 results by less than one rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.precision import dot_in_fp32


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, t_ptr, rows_ptr, starts_ptr, num_cols, in_features,
                   stride_xm, stride_as, stride_ar, stride_tm, DOT_FP32: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tile, slot = tl.program_id(0), tl.program_id(2)
    start, end = tl.load(starts_ptr + slot), tl.load(starts_ptr + slot + 1)
    if start + tile * BLOCK_M >= end:
        return
    places = start + tile * BLOCK_M + tl.arange(0, BLOCK_M)
    is_place = places < end
    rows = tl.load(rows_ptr + places, mask=is_place, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    is_col = cols < num_cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        is_k = ks < in_features
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=is_place[:, None] & is_k[None, :], other=0.0)
        a = tl.load(a_ptr + slot * stride_as + cols[None, :] * stride_ar + ks[:, None],
                    mask=is_k[:, None] & is_col[None, :], other=0.0)     # [BLOCK_K, BLOCK_N]: A^T's tile
        if DOT_FP32:        # no silent TF32: fp32 results must match the torch path
            acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, a.to(x.dtype))
    tl.store(t_ptr + places[:, None] * stride_tm + cols[None, :], acc, mask=is_place[:, None] & is_col[None, :])


@triton.jit
def _expand_kernel(t_ptr, b_ptr, scale_ptr, y_ptr, rows_ptr, starts_ptr, out_features, rank,
                   stride_tm, stride_bs, stride_bn, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    tile, slot = tl.program_id(0), tl.program_id(2)
    start, end = tl.load(starts_ptr + slot), tl.load(starts_ptr + slot + 1)
    if start + tile * BLOCK_M >= end:
        return
    places = start + tile * BLOCK_M + tl.arange(0, BLOCK_M)
    is_place = places < end
    rows = tl.load(rows_ptr + places, mask=is_place, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    is_col = cols < out_features
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        t = tl.load(t_ptr + places[:, None] * stride_tm + rs[None, :], mask=is_place[:, None], other=0.0)
        b = tl.load(b_ptr + slot * stride_bs + cols[None, :] * stride_bn + rs[:, None], mask=is_col[None, :],
                    other=0.0)      # [BLOCK_R, BLOCK_N]: B^T's tile
        acc += tl.dot(t, b.to(tl.float32), input_precision="ieee")
    acc = acc * tl.load(scale_ptr + slot)
    mask = is_place[:, None] & is_col[None, :]
    out = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    y = tl.load(out, mask=mask, other=0.0)
    tl.store(out, (y.to(tl.float32) + acc).to(y_ptr.dtype.element_ty), mask=mask)


def _block_m(num_tokens: int) -> int:
    # tl.dot needs at least 16 rows; decode steps give each slot a few tokens, prefills many.
    return 16 if num_tokens <= 16 else (32 if num_tokens <= 32 else 64)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, sorted_rows: torch.Tensor, slot_starts: torch.Tensor,
                num_lora_tokens: int) -> torch.Tensor:
    """x [num_tokens, in] (rows unit-strided), a [num_slots, cols, in] -> t fp32 [num_lora_tokens, cols],
    row p for the token sorted_rows[p]."""
    num_slots, num_cols, in_features = a.shape
    t = torch.empty(num_lora_tokens, num_cols, dtype=torch.float32, device=x.device)
    block_m, block_n = _block_m(num_lora_tokens), min(64, triton.next_power_of_2(num_cols))
    grid = (triton.cdiv(num_lora_tokens, block_m), triton.cdiv(num_cols, block_n), num_slots)
    _shrink_kernel[grid](x, a, t, sorted_rows, slot_starts, num_cols, in_features, x.stride(0), a.stride(0),
                         a.stride(1), t.stride(0), DOT_FP32=dot_in_fp32(x.dtype), BLOCK_M=block_m, BLOCK_N=block_n,
                         BLOCK_K=64)
    return t


def lora_expand_(y: torch.Tensor, t: torch.Tensor, b: torch.Tensor, scale: torch.Tensor,
                 sorted_rows: torch.Tensor, slot_starts: torch.Tensor) -> None:
    """y [num_tokens, out] (a column slice of the linear's output is fine) += (t @ B[slot]^T) * scale[slot]
    on each LoRA token's row; t [num_lora_tokens, rank] (a column slice of lora_shrink's output),
    b [num_slots, out, rank], scale fp32 [num_slots]."""
    num_slots, out_features, rank = b.shape
    num_lora_tokens = t.shape[0]
    block_m, block_n = _block_m(num_lora_tokens), 64
    grid = (triton.cdiv(num_lora_tokens, block_m), triton.cdiv(out_features, block_n), num_slots)
    _expand_kernel[grid](t, b, scale, y, sorted_rows, slot_starts, out_features, rank, t.stride(0), b.stride(0),
                         b.stride(1), y.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=min(rank, 64))
