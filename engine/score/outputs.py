"""What the scoring engines hand back, one value per input row, in input order. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClassifyResult:
    """The result of classifying one row (a text, or a chat scored by a reward model)."""

    label: str | None               # the best label (config.json's id2label); None for a one-label head
                                    # (regression, reward) and when error is set
    score: float | None             # the best label's score after the activation; a one-label head's value
    labels: tuple[str, ...] = ()    # sigmoid: every label whose score reaches the threshold, best first;
                                    # softmax: (label,); a one-label head: ()
    scores: dict[str, float] | None = None   # label -> score for every label, when return_all_scores
    num_tokens: int = 0             # tokens fed to the model after truncation, special tokens included
    error: str | None = None        # why this row has no result ("text is null", ...)

    @property
    def is_ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class ScoreOutput:
    """The score of one (query, document) pair."""

    score: float | None             # higher is more relevant; None when error is set
    num_tokens: int = 0             # tokens the pair cost the model (a bi-encoder: both texts')
    error: str | None = None        # why this pair has no score

    @property
    def is_ok(self) -> bool:
        return self.error is None
