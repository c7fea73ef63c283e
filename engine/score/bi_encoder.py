"""BiEncoder: an embedding model scores (query, document) pairs by the cosine of their
two embeddings, through the embedder (engine/embed/embedder.py). Each distinct text is
embedded once, however many pairs it is in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from engine.embed.embedder import Embedder
from engine.embed.params import EmbedParams
from engine.score.outputs import ScoreOutput
from engine.score.params import ScoreParams
from engine.score.rows import pair_error


class BiEncoder:
    def __init__(self, embedder: Embedder):
        self.embedder = embedder

    @classmethod
    def load(cls, folder: str | Path, dtype: torch.dtype, device: torch.device, max_batch_tokens: int,
             quantization: str | None = None) -> "BiEncoder":
        return cls(Embedder.load(folder, dtype, device, max_batch_tokens, quantization))

    @property
    def settings(self) -> dict:
        return self.embedder.settings

    @property
    def step_observers(self) -> list:
        return self.embedder.step_observers

    def score_pairs(self, queries: Sequence, documents: Sequence, params: ScoreParams) -> list[ScoreOutput]:
        """The cosine of each pair's two embeddings, in input order; a bad pair gets .error."""
        if len(queries) != len(documents):
            raise ValueError(f"{len(queries)} queries for {len(documents)} documents")
        errors = [pair_error(query, document) for query, document in zip(queries, documents)]
        texts = list(dict.fromkeys(text for error, query, document in zip(errors, queries, documents)
                                   if error is None for text in (query, document)))
        embedded = dict(zip(texts, self.embedder.encode(texts, EmbedParams(normalize=True, truncate=params.truncate))))
        outputs = []
        for error, query, document in zip(errors, queries, documents):
            if error is not None:
                outputs.append(ScoreOutput(None, 0, error))
                continue
            pair = (embedded[query], embedded[document])
            num_tokens = pair[0].num_tokens + pair[1].num_tokens
            failed = next((output.error for output in pair if output.error), None)
            outputs.append(ScoreOutput(None, num_tokens, failed) if failed else
                           ScoreOutput(float(np.dot(pair[0].embedding, pair[1].embedding)), num_tokens))
        return outputs
