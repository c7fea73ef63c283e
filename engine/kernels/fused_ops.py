"""The decoder layer's small ops fused into one Triton kernel each, for CUDA (tested on CPU
with TRITON_INTERPRET=1 against the PyTorch ops they replace, which stay the CPU path):

    rms_norm        x -> weight * norm(x)                                  1 kernel, was 8
    add_rms_norm    residual += x (in place), then weight * norm(residual)  1 kernel, was 9
    silu_and_mul    [gate | up] -> silu(gate) * up                         1 kernel, was 2 + a split
    rotary_         q and k rotated in place (rotate-half layout)           1 kernel, was 10

NOTE: each kernel rounds where the PyTorch op it replaces rounds (the residual sum to the
activation dtype before it is normalised, the normalised row before the weight multiplies
it, silu(gate) before the product), and computes in fp32 between: results stay within the
dtype's rounding of the reference, and are equal to it in fp32 up to the reduction order.
One program handles one row (a token, or a token's head), which suits decode batches of
a few hundred rows of a few thousand columns; no op here syncs with the host, so a CUDA
graph can hold them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, num_cols, stride_x, stride_r, stride_o, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(residual_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / num_cols + eps)
    normed = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, num_cols, stride_in, stride_out, BLOCK: tl.constexpr):
    row, block = tl.program_id(0), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_cols
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + num_cols + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(x_ptr, cos_ptr, sin_ptr, stride_xt, stride_xh, stride_ct, stride_st, half_dim,
                   BLOCK: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < half_dim
    first_ptr = x_ptr + token * stride_xt + head * stride_xh + offs
    first = tl.load(first_ptr, mask=mask, other=0.0).to(tl.float32)
    second = tl.load(first_ptr + half_dim, mask=mask, other=0.0).to(tl.float32)
    # cos/sin repeat their first half in the second (rotate-half layout): the first half is enough.
    cos = tl.load(cos_ptr + token * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * stride_st + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(first_ptr, (first * cos - second * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first_ptr + half_dim, (second * cos + first * sin).to(x_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"expected a 2-D tensor with contiguous rows, got shape {tuple(x.shape)} "
                         f"and strides {x.stride()}")
    return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, hidden] -> weight * x / rms(x), in the dtype PyTorch gives weight * x."""
    x = _rows(x)
    out = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    _norm(x, None, weight, out, eps)
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x in place (in residual's dtype), then rms_norm of the sum."""
    x, residual = _rows(x), _rows(residual)
    if x.shape != residual.shape:
        raise ValueError(f"x {tuple(x.shape)} and residual {tuple(residual.shape)} must have one shape")
    out = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    _norm(x, residual, weight, out, eps)
    return out


def _norm(x, residual, weight, out, eps):
    num_rows, num_cols = x.shape
    if num_rows:
        _rms_norm_kernel[(num_rows,)](x, residual if residual is not None else x, weight, out, num_cols, x.stride(0),
                                      (residual if residual is not None else x).stride(0), out.stride(0), eps,
                                      HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(num_cols))


def silu_and_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """gate_up [rows, 2 * size] (gate first) -> silu(gate) * up [rows, size]."""
    gate_up = _rows(gate_up)
    num_rows, size = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(num_rows, size, dtype=gate_up.dtype, device=gate_up.device)
    block = min(block, triton.next_power_of_2(size))
    if num_rows:
        _silu_and_mul_kernel[(num_rows, triton.cdiv(size, block))](gate_up, out, size, gate_up.stride(0),
                                                                  out.stride(0), BLOCK=block)
    return out


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim] (a strided view, e.g. q and k side by side in the fused QKV
    output) rotated in place by cos/sin [tokens, 1 or any, head_dim]; returns x."""
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1 or head_dim % 2:
        raise ValueError("rotary_ needs an even head_dim and contiguous last dims")
    if num_tokens:
        _rotary_kernel[(num_tokens, num_heads)](x, cos, sin, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
                                                head_dim // 2, BLOCK=triton.next_power_of_2(head_dim // 2))
    return x
