"""Triton GEMMs over FP8 weights, each beside the PyTorch reference it is tested against
(on CPU with TRITON_INTERPRET=1, on GPU by bench/fp8_bench.py).

    fp8_weight_only_matmul   W8A16: x in 16/32-bit, weights dequantized tile by tile inside
                             the GEMM (any GPU: the weights cross memory as 1 byte each)
    fp8_w8a8_group_matmul    W8A8 with 128x128 block weight scales and per-token, per-K-group
                             activation scales (FP8 tensor cores, capability >= 8.9)

Weights are float8_e4m3fn [N, K] with row-form scales float32 [N, num_groups] (see
engine/quant/fp8.py): w[n, k] = q[n, k] * scale[n, k // group_size].
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.kernels.precision import dot_in_fp32
from engine.quant.fp8 import dequantize, expand_scale


@triton.jit
def _weight_only_kernel(x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr, M, N, K, group_size,
                        stride_xm, stride_wn, stride_sn, stride_om,
                        HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        w_mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None], mask=w_mask, other=0.0)   # [BK, BN]
        s = tl.load(s_ptr + offs_n[None, :] * stride_sn + offs_k[:, None] // group_size, mask=w_mask, other=0.0)
        w = w.to(tl.float32) * s
        if DOT_FP32:    # no silent TF32: fp32 results must match the reference
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def _block_m(num_tokens: int) -> int:
    # tl.dot needs at least 16 rows; decode batches are small, prefill batches large.
    return 16 if num_tokens <= 16 else (32 if num_tokens <= 32 else 64)


def fp8_weight_only_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, group_size: int,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (fp32/bf16/fp16) @ dequantized(weight [N, K]).T + bias -> [M, N] in x's dtype."""
    x, weight, scale = x.contiguous(), weight.contiguous(), scale.contiguous()
    (num_tokens, in_features), out_features = x.shape, weight.shape[0]
    out = torch.empty(num_tokens, out_features, dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = _block_m(num_tokens), 64, 64
    grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(out_features, block_n))
    _weight_only_kernel[grid](x, weight, scale, bias if bias is not None else scale, out,
                              num_tokens, out_features, in_features, group_size,
                              x.stride(0), weight.stride(0), scale.stride(0), out.stride(0),
                              HAS_BIAS=bias is not None, DOT_FP32=dot_in_fp32(x.dtype),
                              BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def reference_weight_only(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, group_size: int,
                          bias: torch.Tensor | None = None) -> torch.Tensor:
    out = x.float() @ dequantize(weight, scale, group_size).T
    return (out if bias is None else out + bias.float()).to(x.dtype)


@triton.jit
def _w8a8_group_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, M, N, K, num_groups,
                       stride_xm, stride_xsm, stride_wn, stride_wsn, stride_om,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr):
    # One K step per scale group: the FP8 dot of a group is exact in fp32, then both scales apply.
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for group in range(0, num_groups):
        offs_k = group * GROUP + tl.arange(0, GROUP)
        a = tl.load(xq_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None],
                    mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        a_scale = tl.load(xs_ptr + offs_m * stride_xsm + group, mask=offs_m < M, other=0.0)
        b_scale = tl.load(ws_ptr + offs_n * stride_wsn + group, mask=offs_n < N, other=0.0)
        acc += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# On a GPU the W8A8 kernel's tile width, warps and pipeline depth are tuned per shape: a
# decode step (16-row tiles) is a stream of weight bytes that wants many programs and deep
# pipelines in flight; a prefill tile wants wide tiles. Tuned once per (N, K, row tile), on
# the first call (a CUDA graph's warm-up, before capture), briefly: 8 configs at ~25 ms.
W8A8_CONFIGS = [triton.Config({"BLOCK_N": block_n}, num_warps=warps, num_stages=stages)
                for block_n, warps, stages in ((32, 4, 4), (64, 4, 3), (64, 4, 4), (64, 8, 4), (128, 4, 3),
                                               (128, 8, 3), (128, 8, 4), (256, 8, 3))]
_w8a8_group_kernel_tuned = triton.autotune(
    configs=W8A8_CONFIGS, key=["N", "K", "BLOCK_M"],
    do_bench=functools.partial(triton.testing.do_bench, warmup=5, rep=20))(_w8a8_group_kernel)


def fp8_w8a8_group_matmul(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                          group_size: int, out_dtype: torch.dtype) -> torch.Tensor:
    """x_q float8 [M, K] with scales [M, num_groups] @ weight float8 [N, K] with row-form
    scales [N, num_groups] -> [M, N] of out_dtype; group_size a power of two >= 16."""
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two >= 16 for the W8A8 kernel, got {group_size}")
    x_q, x_scale, weight, scale = x_q.contiguous(), x_scale.contiguous(), weight.contiguous(), scale.contiguous()
    (num_tokens, in_features), out_features = x_q.shape, weight.shape[0]
    out = torch.empty(num_tokens, out_features, dtype=out_dtype, device=x_q.device)
    block_m = _block_m(num_tokens)
    args = (x_q, x_scale, weight, scale, out, num_tokens, out_features, in_features, scale.shape[1],
            x_q.stride(0), x_scale.stride(0), weight.stride(0), scale.stride(0), out.stride(0))
    if x_q.device.type == "cuda":
        grid = lambda meta: (triton.cdiv(num_tokens, block_m), triton.cdiv(out_features, meta["BLOCK_N"]))  # noqa: E731
        _w8a8_group_kernel_tuned[grid](*args, BLOCK_M=block_m, GROUP=group_size)
    else:   # the interpreter: one fixed tile (tuning would time the interpreter)
        grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(out_features, 64))
        _w8a8_group_kernel[grid](*args, BLOCK_M=block_m, BLOCK_N=64, GROUP=group_size)
    return out


def reference_w8a8(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                   group_size: int, out_dtype: torch.dtype) -> torch.Tensor:
    x = x_q.float() * expand_scale(x_scale.float(), x_q.shape[1], group_size)
    return (x @ dequantize(weight, scale, group_size).T).to(out_dtype)
