"""LoraOptions: how many adapters a generate engine holds, and how large they may be."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SUPPORTED_RANK = 128      # the Triton kernels' rank tile; vLLM and SGLang stop at 256 and 512


@dataclass(frozen=True)
class LoraOptions:
    max_loras: int = 8            # adapters resident on the device at once: the most one step can mix
    max_lora_rank: int = 16       # larger adapters are refused at load; every slot is padded to it (vLLM's default)
    max_cpu_loras: int = 32       # adapters kept loaded on the host (LRU) so that a slot refills by a copy

    def __post_init__(self) -> None:
        for name in ("max_loras", "max_lora_rank", "max_cpu_loras"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_lora_rank > MAX_SUPPORTED_RANK:
            raise ValueError(f"max_lora_rank must be <= {MAX_SUPPORTED_RANK}, got {self.max_lora_rank}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})")
