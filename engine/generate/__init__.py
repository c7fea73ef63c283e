"""The generate mode: Llama-family decoders, continuous batching over a paged KV cache."""

from engine.generate.llm_engine import LLMEngine, RunStats
from engine.generate.options import GenerateOptions
from engine.generate.outputs import GenerationOutput
from engine.generate.sampling_params import SamplingParams

__all__ = ["GenerateOptions", "GenerationOutput", "LLMEngine", "RunStats", "SamplingParams"]
