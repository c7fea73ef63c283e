"""ClassifyParams and ScoreParams: what a caller chooses per classify or score call,
checked in one place.

Torch-free: the worker builds them from a job's params without loading the model."""

from __future__ import annotations

from dataclasses import dataclass

# "auto": what the model's config.json says (engine.score.head_config.HeadConfig.activation).
CLASSIFY_ACTIVATIONS = ("auto", "softmax", "sigmoid", "none")
SCORE_ACTIVATIONS = ("auto", "sigmoid", "none")


@dataclass(frozen=True)
class ClassifyParams:
    """How to turn each row (a text, or a chat for a reward model) into labels and scores
    (the job's `params` for mode "classify")."""

    truncate: bool = True           # cut texts at max_seq_length; False: refuse them with an error
                                    # (a chat is never cut: its end is what a reward model scores)
    activation: str = "auto"        # "auto": sigmoid for multi_label_classification, none (the raw
                                    # value) for one label (regression, reward), else softmax;
                                    # or "softmax" | "sigmoid" | "none" whatever the config says
    threshold: float = 0.5          # with sigmoid: the labels whose score reaches it are the row's labels
    return_all_scores: bool = False  # every label's score per row (ClassifyResult.scores), not only the top

    def __post_init__(self) -> None:
        _check_bool("truncate", self.truncate)
        _check_bool("return_all_scores", self.return_all_scores)
        _check_choice("activation", self.activation, CLASSIFY_ACTIVATIONS)
        threshold = self.threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be a number in [0, 1], got {threshold!r}")


@dataclass(frozen=True)
class ScoreParams:
    """How to score (query, document) pairs (the job's `params` for mode "score").

    Which scorer runs is the model's to say (engine.score.head_config.score_method): a
    one-label sequence classifier is a cross-encoder, a causal LM a yes/no reranker, an
    embedding model a bi-encoder. Each field below applies to some of them only."""

    truncate: bool = True           # cut the pair to fit (the document first); False: refuse it with an error
    activation: str = "auto"        # cross-encoder: "auto" is CrossEncoder.predict's default (the folder's
                                    # saved activation_fn, else sigmoid for one label); "sigmoid" | "none"
    instruction: str | None = None  # yes/no reranker: the task in the prompt; None: Qwen3-Reranker's default
    yes_token: str = "yes"          # yes/no reranker: the token whose probability is the score ...
    no_token: str = "no"            # ... against this one (a softmax over the two logits)
    group_by_query: bool = True     # yes/no reranker: a query's pairs run together, after one of them has
                                    # cached the instruction + query prompt; False: the pairs in input order

    def __post_init__(self) -> None:
        _check_bool("truncate", self.truncate)
        _check_bool("group_by_query", self.group_by_query)
        _check_choice("activation", self.activation, SCORE_ACTIVATIONS)
        if self.instruction is not None and not isinstance(self.instruction, str):
            raise ValueError(f"instruction must be a string or None, got {self.instruction!r}")
        for name in ("yes_token", "no_token"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if self.yes_token == self.no_token:
            raise ValueError(f"yes_token and no_token must differ, both are {self.yes_token!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
