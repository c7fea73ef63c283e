"""Barge's inference engine: Hugging Face–format model folders in, results per row out.

The names below load on first use (PEP 562), not at `import engine`: the client, the
API server and `barge submit` import torch-free parts of the engine (the structured-output
constraints, engine.generate.structured) without paying for torch and the models."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_names

_WHERE = {"Engine": "engine.engine", "GenerationOutput": "engine.generate.outputs",
          "SamplingParams": "engine.generate.sampling_params", "EmbeddingOutput": "engine.outputs",
          "StepStats": "engine.step_stats"}

__all__ = ["Engine", "EmbeddingOutput", "GenerationOutput", "SamplingParams", "StepStats"]

if TYPE_CHECKING:
    from engine.engine import Engine
    from engine.generate.outputs import GenerationOutput
    from engine.generate.sampling_params import SamplingParams
    from engine.outputs import EmbeddingOutput
    from engine.step_stats import StepStats


__getattr__ = lazy_names(__name__, _WHERE)
