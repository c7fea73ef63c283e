"""Barge's inference engine: Hugging Face–format model folders in, results per row out."""

from engine.engine import Engine
from engine.generate import GenerationOutput, SamplingParams
from engine.outputs import EmbeddingOutput
from engine.step_stats import StepStats

__all__ = ["Engine", "EmbeddingOutput", "GenerationOutput", "SamplingParams", "StepStats"]
