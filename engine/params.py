"""Per-call parameters of the embed mode, validated in one place."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OUTPUT_DTYPES = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class EmbedParams:
    """How to turn each text into a vector (the job's `params` for mode "embed")."""

    dimensions: int | None = None   # Matryoshka: keep the first `dimensions` values (then normalise)
    normalize: bool = True          # L2-normalise the (truncated) vector
    truncate: bool = True           # cut texts at max_seq_length; False: refuse them with an error
    output_dtype: str = "float32"   # "float32" | "float16": the dtype of each returned vector
    prompt: str | None = None       # text put before every input, e.g. Qwen3-Embedding's
                                    # "Instruct: {task}\nQuery:" for queries (sentence-transformers' prompt=)
    prompt_name: str | None = None  # or one of the model's named prompts (config_sentence_transformers.json)

    def check(self, embedding_dim: int) -> None:
        """ValueError naming the bad value; `embedding_dim` is the model's hidden size."""
        dimensions = self.dimensions
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or not 0 < dimensions <= embedding_dim):
            raise ValueError(f"dimensions must be an int in 1..{embedding_dim} (the model's hidden size), "
                             f"got {dimensions!r}")
        for name in ("normalize", "truncate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("prompt", "prompt_name"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string or None, got {getattr(self, name)!r}")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {tuple(OUTPUT_DTYPES)}, got {self.output_dtype!r}")

    @property
    def numpy_dtype(self) -> type:
        return OUTPUT_DTYPES[self.output_dtype]
