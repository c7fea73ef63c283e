"""PairScorer: one model scoring (query, document) pairs, whichever way its folder calls for.

    score_method    scorer          score of a pair
    cross-encoder   Classifier      CrossEncoder.predict's: the pair through the model together, its activation
    yes-no          YesNoReranker   P(yes) after the Qwen3-Reranker prompt, through the generate engine
    bi-encoder      BiEncoder       the cosine of the two texts' embeddings

The job wiring builds one with PairScorer.load and calls score_rows per shard (a bad pair is
a ScoreOutput with .error); score is the strict form, raising on the first bad pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from engine.generate.options import GenerateOptions
from engine.score.bi_encoder import BiEncoder
from engine.score.classifier import Classifier
from engine.score.head_config import score_method
from engine.score.outputs import ScoreOutput
from engine.score.params import ScoreParams
from engine.score.reranker import YesNoReranker


class PairModel(Protocol):
    def score_pairs(self, queries: Sequence, documents: Sequence, params: ScoreParams) -> list[ScoreOutput]: ...

    @property
    def settings(self) -> dict: ...

    @property
    def step_observers(self) -> list: ...


class PairScorer:
    def __init__(self, method: str, model: PairModel):
        self.method = method      # "cross-encoder" | "yes-no" | "bi-encoder" (engine.score.head_config.score_method)
        self.model = model

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype, device: torch.device, max_batch_tokens: int,
             quantization: str | None = None, options: GenerateOptions | None = None) -> "PairScorer":
        """max_batch_tokens: real tokens per forward pass of an encoder (cross- and bi-encoders);
        options: the generate engine's sizing, for a yes/no reranker."""
        method = score_method(path)
        if method == "yes-no":
            return cls(method, YesNoReranker.load(path, dtype, device, options, quantization))
        if options is not None:
            raise ValueError(f"options (GenerateOptions) apply to a yes/no reranker only; {path} is a {method}")
        if method == "cross-encoder":
            return cls(method, Classifier.load(path, dtype, device, max_batch_tokens, quantization))
        return cls(method, BiEncoder.load(path, dtype, device, max_batch_tokens, quantization))

    @property
    def settings(self) -> dict:
        return {**self.model.settings, "score_method": self.method}

    @property
    def step_observers(self) -> list:
        """Called with each forward batch's (a yes/no reranker: each engine step's) StepStats."""
        return self.model.step_observers

    def score_rows(self, queries: Sequence, documents: Sequence, params: ScoreParams) -> list[ScoreOutput]:
        """One ScoreOutput per pair, in input order; a bad pair carries .error instead of raising."""
        return self.model.score_pairs(queries, documents, params)

    def score(self, queries: Sequence, documents: Sequence, params: ScoreParams | None = None) -> list[float]:
        """One score per pair, in input order (higher is more relevant); ValueError naming the first bad pair."""
        outputs = self.score_rows(queries, documents, params or ScoreParams())
        for index, output in enumerate(outputs):
            if output.error:
                raise ValueError(f"row {index}: {output.error}")
        return [output.score for output in outputs]
