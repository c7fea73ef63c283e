"""What the engine hands back, one value per input row, in input order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EmbeddingOutput:
    """The result of embedding one text."""

    embedding: np.ndarray | None   # float32 [dimensions or embedding_dim]; None when error is set
    num_tokens: int                # tokens fed to the model after truncation, special tokens included
    error: str | None = None       # why this row has no embedding ("text is null", ...)

    @property
    def is_ok(self) -> bool:
        return self.error is None
