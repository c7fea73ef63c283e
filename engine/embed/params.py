"""EmbedParams: what a caller chooses per embed call, checked in one place.

Torch-free: the worker builds it from a job's params (queueing.inference) without the model."""

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

    def __post_init__(self) -> None:
        """Everything but the width's upper bound, which needs the model (check)."""
        dimensions = self.dimensions
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or dimensions < 1):
            raise ValueError(f"dimensions must be a positive int or None, got {dimensions!r}")
        for name in ("normalize", "truncate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("prompt", "prompt_name"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string or None, got {getattr(self, name)!r}")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"output_dtype must be one of {tuple(OUTPUT_DTYPES)}, got {self.output_dtype!r}")

    def check(self, embedding_dim: int) -> None:
        """ValueError naming `dimensions` when it is wider than the model's `embedding_dim` (its hidden size)."""
        if self.dimensions is not None and self.dimensions > embedding_dim:
            raise ValueError(f"dimensions must be an int in 1..{embedding_dim} (the model's hidden size), "
                             f"got {self.dimensions!r}")

    @property
    def numpy_dtype(self) -> type:
        return OUTPUT_DTYPES[self.output_dtype]
