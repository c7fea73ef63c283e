"""KV cache: one tensor of blocks for every layer's keys and values, sized from free memory.

NOTE: kv_cache_dtype="fp8" (GenerateOptions) stores K and V as E4M3 with one fp32 scale
per (kv head, token slot) beside them, set when the slot is written (the row's absolute
maximum over head_dim / 448): no calibration, and an outlier token or head costs only its
own row's precision. A slot is written once and read many times, so the scale is final.

    k, v        float8_e4m3fn [num_kv_heads, num_blocks, block_size, head_dim]
    k_scale, .. float32       [num_kv_heads, num_blocks, block_size]
    value(h, slot) = k[h, slot, :] * k_scale[h, slot]

At head_dim 128 a token-head takes 128 + 4 bytes against bf16's 256 (1.94x the blocks in
the same memory), at head_dim 64 68 against 128 (1.88x). Both tensors have static shapes
and the store needs no host value (on CUDA one Triton launch, engine/kernels/kv_store.py;
tensor ops elsewhere), so a CUDA graph holds writes and reads alike. Measured on SmolLM2
(`barge eval-quant --kv-cache-dtype fp8`): +0.3 to +1.2 % perplexity on six held-out texts,
almost all of it from K (V alone: +0.1 %).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from engine.generate.model_config import DecoderConfig
from engine.generate.options import KV_CACHE_DTYPES
from engine.quant.fp8 import FP8_DTYPE as FP8_KV_DTYPE
from engine.quant.fp8 import FP8_MAX        # 448
from engine.quant.fp8 import MIN_SCALE      # an all-zero row (a padding slot) keeps a finite scale, stores zeros

SCALE_DTYPE = torch.float32


class LayerKVCache(NamedTuple):
    """One layer's keys and values (indexable as (k, v) like the 16-bit cache always was)."""

    k: torch.Tensor                         # [num_kv_heads, num_blocks, block_size, head_dim]
    v: torch.Tensor
    k_scale: torch.Tensor | None = None     # fp32 [num_kv_heads, num_blocks, block_size]: fp8 caches only
    v_scale: torch.Tensor | None = None

    @property
    def is_fp8(self) -> bool:
        return self.k_scale is not None


KVCache = list[LayerKVCache]


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype K and V are stored in: the model's for "auto", E4M3 for "fp8"."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return FP8_KV_DTYPE if kv_cache_dtype == "fp8" else model_dtype


def bytes_per_block(config: DecoderConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for one block, in the cache's dtype; an fp8 cache's scales included."""
    element_size = torch.empty((), dtype=dtype).element_size()
    per_token_head = config.head_dim * element_size
    if dtype == FP8_KV_DTYPE:
        per_token_head += torch.empty((), dtype=SCALE_DTYPE).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * per_token_head


def available_memory(device: torch.device) -> int:
    """Bytes the cache may grow into: free device memory, or MemAvailable on CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo; pass num_blocks")


def num_blocks_from_memory(config: DecoderConfig, block_size: int, dtype: torch.dtype, device: torch.device,
                           memory_fraction: float, max_useful_tokens: int) -> int:
    """As many blocks as memory_fraction of what is free allows, but no more than
    max_useful_tokens need (max_num_seqs full-length requests): more would sit idle."""
    by_memory = int(available_memory(device) * memory_fraction) // bytes_per_block(config, block_size, dtype)
    return max(1, min(by_memory, -(-max_useful_tokens // block_size)))


def allocate_kv_cache(config: DecoderConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> KVCache:
    """dtype: the cache's (cache_dtype()); FP8_KV_DTYPE adds the scales."""
    # Zeros, not empty: padded decode rows read slot 0 under a mask, and 0 * NaN would leak.
    # kv head first: a gather of blocks is then [num_kv_heads, ..., head_dim], ready for batched matmuls.
    shape = (config.num_layers, 2, config.num_kv_heads, num_blocks, block_size)
    cache = (lazy_zeros((*shape, config.head_dim), dtype) if device.type == "cpu"
             else torch.zeros(*shape, config.head_dim, dtype=dtype, device=device))
    if dtype != FP8_KV_DTYPE:
        return [LayerKVCache(cache[layer, 0], cache[layer, 1]) for layer in range(config.num_layers)]
    scales = torch.full(shape, MIN_SCALE, dtype=SCALE_DTYPE, device=device)
    return [LayerKVCache(cache[layer, 0], cache[layer, 1], scales[layer, 0], scales[layer, 1])
            for layer in range(config.num_layers)]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (E4M3 values [..., head_dim], fp32 scales [...]) with
    x ~= values * scales[..., None]: one scale per row, its absolute maximum over 448."""
    scales = (x.float().abs().amax(dim=-1) / FP8_MAX).clamp_min(MIN_SCALE)
    values = (x.float() / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)
    return values, scales


def dequantize_rows(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (values.float() * scales[..., None]).to(dtype)


def store_kv(cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write the new tokens' k, v [num_tokens, num_kv_heads, head_dim] to their slots
    (slot_mapping long [num_tokens]), quantized where the cache is fp8: on CUDA in one
    Triton launch for k and v together (engine/kernels/kv_store.py, bit-exact with the
    ops below), elsewhere as tensor ops."""
    if cache.is_fp8 and k.is_cuda:
        from engine.kernels.kv_store import store_fp8_kv
        store_fp8_kv(k, v, slot_mapping, cache.k, cache.v, cache.k_scale, cache.v_scale)
        return
    num_kv_heads, head_dim = cache.k.shape[0], cache.k.shape[-1]
    for rows, values, scales in ((k, cache.k, cache.k_scale), (v, cache.v, cache.v_scale)):
        rows = rows.transpose(0, 1)       # [num_kv_heads, num_tokens, head_dim]
        if scales is not None:
            rows, row_scales = quantize_rows(rows)
            scales.view(num_kv_heads, -1).index_copy_(1, slot_mapping, row_scales)
            rows, values = rows.view(torch.uint8), values.view(torch.uint8)   # no index_copy_ for fp8 on CPU
        values.view(num_kv_heads, -1, head_dim).index_copy_(1, slot_mapping, rows)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, alignment: int = 64) -> torch.Tensor:
    """A zeroed CPU tensor whose pages the OS zeroes as they are first touched: numpy's
    zeros is calloc, which maps fresh pages for a large block instead of writing zeros.
    torch.zeros writes every byte: for SmolLM2's default cache (30% of free memory, about 6
    GiB here) 1.6 s of CPU and all of it resident before the first request, where a batch
    job's engine often touches a fraction. Aligned to `alignment` bytes, as torch's own."""
    num_bytes = math.prod(shape) * dtype.itemsize
    raw = np.zeros(num_bytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return torch.from_numpy(raw[start:start + num_bytes]).view(dtype).view(shape)
