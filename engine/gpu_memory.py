"""How a generate engine's share of a GPU is spent: weights, activations, KV cache.

    device memory  |<------------------------------ total ------------------------------>|
    this engine    |<------------- total x gpu_memory_fraction ------------->|
                   | weights | activation peak |        KV cache blocks      |  (others) |

As vLLM's gpu_memory_utilization, the fraction bounds what this engine itself uses, so
two engine processes on one GPU (`--devices 0,0`) at 0.45 each share it. The weights are
counted from the loaded model's tensors; the activation peak is estimated from the
largest step the scheduler may build (max_num_batched_tokens tokens through the widest
layer, plus max_num_seqs rows of fp32 logits), with a safety factor: it is not measured
by a profiling pass yet. An engine whose weights and activations leave no room for one
step's KV blocks is refused at load (ModelDoesNotFit, with the sizes). On CPU, and when
kv_cache_memory_fraction is asked for instead (BARGE_KV_CACHE_FRACTION), the KV cache
takes that share of free memory, as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("barge.engine")

GIB = 1024 ** 3
ACTIVATION_SAFETY = 2.0      # the estimate is doubled: allocator fragmentation, attention temporaries


class ModelDoesNotFit(ValueError):
    """The model's weights and activations leave no KV cache within its share of the device."""


@dataclass(frozen=True)
class MemoryPlan:
    total_bytes: int             # the device's memory
    fraction: float              # the share this engine may use (BARGE_GPU_MEMORY_FRACTION)
    weights_bytes: int
    activation_bytes: int        # estimated peak of one step
    bytes_per_block: int         # K and V of every layer for one block
    block_size: int              # tokens per block

    @property
    def budget_bytes(self) -> int:
        return int(self.total_bytes * self.fraction)

    @property
    def kv_bytes(self) -> int:
        return max(0, self.budget_bytes - self.weights_bytes - self.activation_bytes)

    @property
    def num_blocks(self) -> int:
        return self.kv_bytes // self.bytes_per_block

    @property
    def max_concurrent_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def describe(self) -> str:
        return (f"device {self.total_bytes / GIB:.2f} GiB x fraction {self.fraction:g} = "
                f"{self.budget_bytes / GIB:.2f} GiB: weights {self.weights_bytes / GIB:.2f} GiB, activations "
                f"{self.activation_bytes / GIB:.2f} GiB (estimated), KV cache {self.kv_bytes / GIB:.2f} GiB = "
                f"{self.num_blocks} blocks of {self.block_size} tokens, {self.max_concurrent_tokens} tokens at once")


def activation_bytes(hidden_size: int, intermediate_size: int, vocab_size: int, max_num_batched_tokens: int,
                     max_num_seqs: int, element_size: int) -> int:
    """The estimated peak of one step: the widest layer's live tensors for every token of
    the step (the MLP's gate and up projections and the residual stream), and fp32 logits
    for every sequence sampled, times ACTIVATION_SAFETY."""
    per_token = (2 * intermediate_size + 4 * hidden_size) * element_size
    logits = max_num_seqs * vocab_size * 4
    return int(ACTIVATION_SAFETY * (max_num_batched_tokens * per_token + logits))


def plan_kv_cache(total_bytes: int, fraction: float, weights_bytes: int, activation_bytes: int,
                  bytes_per_block: int, block_size: int, max_num_batched_tokens: int) -> MemoryPlan:
    """The plan; ModelDoesNotFit when the KV cache could not hold even one step's tokens."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {fraction!r}")
    plan = MemoryPlan(total_bytes, fraction, weights_bytes, activation_bytes, bytes_per_block, block_size)
    if plan.max_concurrent_tokens < min(max_num_batched_tokens, block_size * 4):
        raise ModelDoesNotFit(f"the model does not fit in its share of the device: {plan.describe()}; raise "
                              f"BARGE_GPU_MEMORY_FRACTION, lower max_num_batched_tokens, or use a larger GPU or FP8")
    return plan


def model_bytes(model) -> int:
    """Bytes of a loaded model's parameters and buffers (FP8 weights count one byte each)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def kv_cache_blocks(model, config, options, dtype, device, max_model_len: int) -> int:
    """KV-cache blocks for a generate engine (engine.generate.LLMEngine): on a GPU, what its
    gpu_memory_fraction leaves after weights and activations (logged at load); else, or
    when options.gpu_memory_fraction is None, kv_cache_memory_fraction of free memory."""
    from engine.generate.kv_cache import bytes_per_block, cache_dtype, num_blocks_from_memory
    max_useful_tokens = options.max_num_seqs * max_model_len
    kv_dtype = cache_dtype(options.kv_cache_dtype, dtype)      # fp8: about half the bytes per block
    if device.type != "cuda" or options.gpu_memory_fraction is None:
        return num_blocks_from_memory(config, options.block_size, kv_dtype, device, options.kv_cache_memory_fraction,
                                      max_useful_tokens)
    import torch
    element_size = torch.empty((), dtype=dtype).element_size()
    plan = plan_kv_cache(torch.cuda.get_device_properties(device).total_memory, options.gpu_memory_fraction,
                         model_bytes(model),
                         activation_bytes(config.hidden_size, config.intermediate_size, config.vocab_size,
                                          options.max_num_batched_tokens, options.max_num_seqs, element_size),
                         bytes_per_block(config, options.block_size, kv_dtype), options.block_size,
                         options.max_num_batched_tokens)
    num_blocks = min(plan.num_blocks, -(-max_useful_tokens // options.block_size))
    log.info("GPU memory: %s; %d blocks allocated (max_num_seqs x max_model_len need no more)", plan.describe(),
             num_blocks)
    return num_blocks
