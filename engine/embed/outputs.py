"""What the engine hands back, one value per input row, in input order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EmbeddingOutput:
    """The result of embedding one text."""

    embedding: np.ndarray | None   # [dimensions or embedding_dim], float32 or float16; None when error is set
    num_tokens: int                # tokens fed to the model after truncation, special tokens included
                                   # (a text refused for its length: all of its tokens)
    error: str | None = None       # why this row has no embedding ("text is null", "text has 300 tokens, ...")

    @property
    def is_ok(self) -> bool:
        return self.error is None
