"""The FP8 KV cache's store in one Triton launch: each new token's K and V rows quantized
to E4M3 with their own scale and written to the token's slot (engine/generate/kv_cache.py
holds the layout and the tensor-op version this is tested against, byte for byte).

    k, v            [num_tokens, num_kv_heads, head_dim]      (q's dtype)
    slot_mapping    long [num_tokens]: block * block_size + offset
    k_cache, v_cache  float8_e4m3fn [num_kv_heads, num_blocks, block_size, head_dim]
    k_scale, v_scale  float32       [num_kv_heads, num_blocks, block_size]
    grid            (num_tokens, num_kv_heads): one K row and one V row per program

NOTE: the tensor-op store is a dozen launches per layer (amax, divisions, clamp, cast,
two index_copy_ each for K and V) where the 16-bit store is two; inside a decode CUDA
graph of 32 layers those small launches would cost more than the halved cache reads save
at short contexts. The math is kv_cache.quantize_rows' step for step (scale =
max(amax / 448, 1e-12), correctly rounded divisions, round-to-nearest-even onto E4M3 in
fp32 as engine/kernels/fp8_act_quant.py does), so both stores write the same bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.fp8_act_quant import _round_to_e4m3
from engine.quant.fp8 import FP8_MAX, MIN_SCALE


@triton.jit
def _store_row(x_ptr, cache_ptr, scale_ptr, cache_offset, scale_offset, offs, mask,
               FP8_MAX_: tl.constexpr, MIN_SCALE_: tl.constexpr):
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX_), MIN_SCALE_)
    q = _round_to_e4m3(tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX_, FP8_MAX_))
    tl.store(cache_ptr + cache_offset + offs, q.to(cache_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + scale_offset, scale)


@triton.jit
def _store_fp8_kv_kernel(k_ptr, v_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, head_dim,
                         stride_kt, stride_kh, stride_vt, stride_vh, stride_ch, stride_cs, stride_sh,
                         FP8_MAX_: tl.constexpr, MIN_SCALE_: tl.constexpr, HEAD_DIM: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offs = tl.arange(0, HEAD_DIM)
    mask = offs < head_dim
    cache_offset = head * stride_ch + slot * stride_cs
    scale_offset = head * stride_sh + slot
    _store_row(k_ptr + token * stride_kt + head * stride_kh, k_cache_ptr, k_scale_ptr, cache_offset, scale_offset,
               offs, mask, FP8_MAX_, MIN_SCALE_)
    _store_row(v_ptr + token * stride_vt + head * stride_vh, v_cache_ptr, v_scale_ptr, cache_offset, scale_offset,
               offs, mask, FP8_MAX_, MIN_SCALE_)


def store_fp8_kv(k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """Quantize k, v [num_tokens, num_kv_heads, head_dim] and write them and their scales
    to slot_mapping's slots of the caches (shapes in the module doc), in place."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _check_layout(k_cache, v_cache, k_scale, v_scale)
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    _store_fp8_kv_kernel[(num_tokens, num_kv_heads)](
        k, v, slot_mapping, k_cache, v_cache, k_scale, v_scale, head_dim,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_cache.stride(0), k_cache.stride(2), k_scale.stride(0),
        FP8_MAX_=FP8_MAX, MIN_SCALE_=MIN_SCALE, HEAD_DIM=max(16, triton.next_power_of_2(head_dim)))


def _check_layout(k_cache, v_cache, k_scale, v_scale) -> None:
    """Slots are addressed as block * block_size + offset: each head's blocks must lie end to
    end (as allocate_kv_cache lays them), and K and V alike."""
    block_size, head_dim = k_cache.shape[2], k_cache.shape[3]
    if (k_cache.stride() != v_cache.stride() or k_scale.stride() != v_scale.stride()
            or k_cache.stride()[1:] != (block_size * head_dim, head_dim, 1) or k_scale.stride()[1:] != (block_size, 1)):
        raise ValueError("the fp8 store needs each head's blocks end to end, as allocate_kv_cache lays them out")
