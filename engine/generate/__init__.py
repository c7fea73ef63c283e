"""The generate mode: Llama-family decoders, continuous batching over a paged KV cache.

The names below load on first use (PEP 562): importing engine.generate.structured (the
constraints, torch-free) does not load the model code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_names

_WHERE = {"FinishedRequest": "engine.generate.outputs", "GenerateOptions": "engine.generate.options",
          "GenerationOutput": "engine.generate.outputs", "LLMEngine": "engine.generate.llm_engine",
          "RunStats": "engine.generate.llm_engine", "SamplingParams": "engine.generate.sampling_params"}

__all__ = ["FinishedRequest", "GenerateOptions", "GenerationOutput", "LLMEngine", "RunStats", "SamplingParams"]

if TYPE_CHECKING:
    from engine.generate.llm_engine import LLMEngine, RunStats
    from engine.generate.options import GenerateOptions
    from engine.generate.outputs import FinishedRequest, GenerationOutput
    from engine.generate.sampling_params import SamplingParams


__getattr__ = lazy_names(__name__, _WHERE)
