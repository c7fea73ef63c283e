"""A classifier's logits -> labels and scores: pure decisions on numpy, table-tested in
tests/unit/engine/score/test_labels.py. Torch-free."""

from __future__ import annotations

import numpy as np

from engine.score.head_config import HeadConfig
from engine.score.outputs import ClassifyResult
from engine.score.params import ClassifyParams


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """logits [..., num_labels] (float32) -> scores, the same shape, in float32."""
    logits = logits.astype(np.float32)
    if activation == "softmax":
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return shifted / shifted.sum(axis=-1, keepdims=True)
    if activation == "sigmoid":
        return 0.5 * (1.0 + np.tanh(0.5 * logits))     # = 1 / (1 + exp(-x)), without overflow
    if activation == "none":
        return logits
    raise ValueError(f"unknown activation {activation!r}")


def classify_result(logits: np.ndarray, head: HeadConfig, params: ClassifyParams, num_tokens: int) -> ClassifyResult:
    """One row's result from its logits [num_labels]."""
    activation = head.classify_activation if params.activation == "auto" else params.activation
    scores = activate(logits, activation)
    every = {label: float(score) for label, score in zip(head.labels, scores)} if params.return_all_scores else None
    if head.num_labels == 1:
        return ClassifyResult(None, float(scores[0]), (), every, num_tokens)
    best = int(np.argmax(scores))          # the first of equal scores, as torch.argmax
    if activation == "sigmoid":
        order = sorted(range(head.num_labels), key=lambda index: -scores[index])
        labels = tuple(head.labels[index] for index in order if scores[index] >= params.threshold)
    else:
        labels = (head.labels[best],)
    return ClassifyResult(head.labels[best], float(scores[best]), labels, every, num_tokens)
