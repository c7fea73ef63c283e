"""Dynamic FP8 (E4M3) activation quantization in one Triton kernel each, beside the PyTorch
reference they are tested against (engine/quant/fp8.py's quantize_activations).

    quantize_per_token   x [M, K] -> q float8 [M, K], scale float32 [M, 1]    (torch._scaled_mm's
                         row-wise scale_a for per-channel weights)
    quantize_per_group   x [M, K] -> q float8 [M, K], scale float32 [M, ceil(K / group)]
                         (the Triton block-scale GEMM's activation half)

NOTE: each program reads its row (or row group) once into registers, takes the amax, and
writes the E4M3 values and the scale from there: one launch, no host sync and nothing per
token in Python, where the eager version was five ops (amax, div, clamp, mul, copy) over
x. The math is the reference's, step for step, so the values are bit-exact with it:
scale = max(amax / 448, 1e-12) and q = saturate(x / scale) rounded to nearest even, both
divisions correctly rounded (div_rn: Triton's default fp32 `/` on a GPU is approximate).
The rounding to E4M3 is done in fp32 (`_round_to_e4m3`) so that the final cast is exact:
Triton 3.9's interpreter casts fp32 -> fp8e4nv wrongly where rounding carries into the
next power of two (125.7 became 64, not 128), and the hardware cast needs no such help.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.quant.fp8 import FP8_DTYPE, FP8_MAX, MIN_SCALE

# A whole row per program up to this width (the 8B model's FFN is 14336): wider rows are
# refused rather than read twice.
MAX_ROW_BLOCK = 32768


@triton.jit
def _round_to_e4m3(v):
    # Round-to-nearest-even onto E4M3's grid, in fp32: 3 mantissa bits, so the spacing is
    # 2^(exponent - 3), and 2^-9 below the smallest normal 2^-6 (subnormals). Adding and
    # subtracting 1.5 * 2^23 spacings rounds to a multiple of the spacing (|v| is far smaller).
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    spacing = (((tl.maximum(exponent, -6) - 3) + 127) << 23).to(tl.float32, bitcast=True)
    magic = spacing * 12582912.0                    # 1.5 * 2^23
    return (v + magic) - magic


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, group_size,
                     FP8_MAX_: tl.constexpr, MIN_SCALE_: tl.constexpr, BLOCK: tl.constexpr):
    # Program (row, group): columns group * group_size ... + group_size - 1 of one row.
    row, group = tl.program_id(0), tl.program_id(1)
    offs = group * group_size + tl.arange(0, BLOCK)
    mask = (offs < K) & (tl.arange(0, BLOCK) < group_size)
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX_), MIN_SCALE_)
    q = _round_to_e4m3(tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX_, FP8_MAX_))
    tl.store(q_ptr + row * stride_qm + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sm + group, scale)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (fp32/bf16/fp16) -> (q float8_e4m3fn [M, K], scale float32 [M, 1])."""
    return _quantize(x, x.shape[-1])


def quantize_per_group(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q float8_e4m3fn [M, K], scale float32 [M, ceil(K / group_size)])."""
    if group_size <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    return _quantize(x, group_size)


def _quantize(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 2:
        raise ValueError(f"expected activations [tokens, features], got shape {tuple(x.shape)}")
    num_tokens, in_features = x.shape
    group_size = min(group_size, in_features)
    block = triton.next_power_of_2(group_size)
    if block > MAX_ROW_BLOCK:
        raise ValueError(f"a group of {group_size} columns is wider than one program's {MAX_ROW_BLOCK}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_groups = triton.cdiv(in_features, group_size)
    q = torch.empty(num_tokens, in_features, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_tokens, num_groups, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return q, scale
    _quantize_kernel[(num_tokens, num_groups)](x, q, scale, in_features, x.stride(0), q.stride(0), scale.stride(0),
                                               group_size, FP8_MAX_=FP8_MAX, MIN_SCALE_=MIN_SCALE, BLOCK=block,
                                               num_warps=_num_warps(block))
    return q, scale


def _num_warps(block: int) -> int:
    return 1 if block <= 256 else (4 if block <= 4096 else 8)
