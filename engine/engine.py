"""Engine: the one entry point — load a model folder for a mode, then run rows through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.embedder import Embedder
from engine.outputs import EmbeddingOutput

MODES = ("generate", "embed", "transcribe")
NOT_YET_IMPLEMENTED = ("generate", "transcribe")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Engine:
    """A loaded model serving one mode. Build it with Engine.from_pretrained."""

    def __init__(self, mode: str, embedder: Embedder):
        self.mode = mode
        self._embedder = embedder

    @classmethod
    def from_pretrained(cls, path: str | Path, mode: str = "embed", dtype: str | torch.dtype = "float32",
                        device: str | torch.device | None = None, max_batch_tokens: int = 16384) -> "Engine":
        """Load a Hugging Face–format folder (config.json, model.safetensors, tokenizer.json)."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        if mode in NOT_YET_IMPLEMENTED:
            raise ValueError(f"mode {mode!r} is not implemented yet; only 'embed' is available")
        embedder = Embedder.load(path, resolve_dtype(dtype), resolve_device(device), max_batch_tokens)
        return cls(mode, embedder)

    @property
    def model_name(self) -> str:
        return self._embedder.config.model_name

    @property
    def embedding_dim(self) -> int:
        return self._embedder.embedding_dim

    @property
    def max_seq_length(self) -> int:
        return self._embedder.config.max_seq_length

    def embed(self, texts: list[str], dimensions: int | None = None, normalize: bool = True) -> np.ndarray:
        """float32 [len(texts), dimensions or embedding_dim] in input order; ValueError naming a bad row."""
        return self._embedder.embed(texts, dimensions, normalize)

    def encode(self, texts: list, dimensions: int | None = None, normalize: bool = True) -> list[EmbeddingOutput]:
        """One EmbeddingOutput per text in input order; bad rows carry .error instead of raising."""
        return self._embedder.encode(texts, dimensions, normalize)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {tuple(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
