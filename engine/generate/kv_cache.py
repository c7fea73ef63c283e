"""KV cache: one tensor of blocks for every layer's keys and values, sized from free memory."""

from __future__ import annotations

import torch

from engine.generate.model_config import DecoderConfig

KVCache = list[tuple[torch.Tensor, torch.Tensor]]   # per layer: (k, v), each [num_kv_heads, num_blocks, block_size, head_dim]


def bytes_per_block(config: DecoderConfig, block_size: int, dtype: torch.dtype) -> int:
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element_size


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
    # Zeros, not empty: padded decode rows read slot 0 under a mask, and 0 * NaN would leak.
    # kv head first: a gather of blocks is then [num_kv_heads, ..., head_dim], ready for batched matmuls.
    cache = torch.zeros(config.num_layers, 2, config.num_kv_heads, num_blocks, block_size, config.head_dim,
                        dtype=dtype, device=device)
    return [(cache[layer, 0], cache[layer, 1]) for layer in range(config.num_layers)]
