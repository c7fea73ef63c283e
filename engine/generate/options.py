"""GenerateOptions: how the generate engine is sized — batch, KV cache, context."""

from __future__ import annotations

from dataclasses import dataclass

KV_CACHE_DTYPES = ("auto", "fp8")     # "auto": the model's dtype; "fp8": E4M3 with per-slot scales (kv_cache.py)


@dataclass(frozen=True)
class GenerateOptions:
    max_num_seqs: int = 128                 # requests in the running batch at once
    max_num_batched_tokens: int = 2048      # new tokens per step; longer prompts are prefilled in chunks
    max_model_len: int | None = None        # prompt + output limit; None = what the model and cache allow
    block_size: int = 16                    # tokens per KV-cache block
    num_blocks: int | None = None           # KV-cache blocks; None = sized from free memory
    kv_cache_memory_fraction: float = 0.3   # of free memory (MemAvailable on CPU) when num_blocks is None
    gpu_memory_fraction: float | None = 0.9  # on a GPU: the share of the device for weights, activations and KV
                                             # cache (engine.gpu_memory); None: kv_cache_memory_fraction there too
    enable_prefix_caching: bool = True
    seed: int | None = 0                    # for requests without their own seed; None = nondeterministic
    enable_jump_forward: bool = False       # structured output: append what the grammar forces without a step
                                            # each (a request's SamplingParams.jump_forward overrides it). Off by
                                            # default: the forced tokens are xgrammar's, not the model's, so greedy
                                            # text can differ from transformers' and vLLM's (5 of the 32 prompts
                                            # of tests/models/test_structured_smollm2.py)
    enforce_eager: bool = False             # on CUDA: no CUDA graphs for decode steps (engine/generate/cuda_graph.py);
                                            # there are none on CPU either way
    kv_cache_dtype: str = "auto"            # "auto" (the model's dtype) or "fp8": E4M3 K/V, about 1.9x the blocks
    order_by_prefix: bool = True            # generate() and the worker's feed run prompts grouped by shared token
                                            # prefix, deepest first (engine/generate/prefix_order.py)
    prefix_aware_admission: bool = True     # the scheduler holds back a request whose prefix another is computing
                                            # and pins waiting prompts' blocks (scheduler.py); False: first come,
                                            # first served, as before issue 47

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len", "num_blocks"):
            value = getattr(self, name)
            if value is None and name in ("max_model_len", "num_blocks"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.gpu_memory_fraction is not None and not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(map(repr, KV_CACHE_DTYPES))}, "
                             f"got {self.kv_cache_dtype!r}")
        if not 0.0 < self.kv_cache_memory_fraction <= 0.95:
            raise ValueError(f"kv_cache_memory_fraction must be in (0, 0.95], got {self.kv_cache_memory_fraction!r}")
