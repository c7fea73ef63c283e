"""Barge's inference engine: Hugging Face–format model folders in, results per row out.

The names below load on first use (PEP 562), not at `import engine`: the client, the
API server and `barge submit` import torch-free parts of the engine (the structured-output
constraints, engine.generate.structured) without paying for torch and the models."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.lazy import lazy_names

_WHERE = {"Engine": "engine.engine", "StepStats": "engine.step_stats",
          # each mode's params and output
          "EmbedParams": "engine.embed.params", "EmbeddingOutput": "engine.embed.outputs",
          "SamplingParams": "engine.generate.sampling_params", "GenerationOutput": "engine.generate.outputs",
          "TranscribeParams": "engine.whisper.params"}

__all__ = ["Engine", "EmbedParams", "EmbeddingOutput", "GenerationOutput", "SamplingParams", "StepStats",
           "TranscribeParams"]

if TYPE_CHECKING:
    from engine.embed.outputs import EmbeddingOutput
    from engine.embed.params import EmbedParams
    from engine.engine import Engine
    from engine.generate.outputs import GenerationOutput
    from engine.generate.sampling_params import SamplingParams
    from engine.step_stats import StepStats
    from engine.whisper.params import TranscribeParams


__getattr__ = lazy_names(__name__, _WHERE)
