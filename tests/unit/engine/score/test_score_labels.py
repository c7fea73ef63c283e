"""A classifier's logits -> labels and scores, by the head's problem type or the caller's activation."""

import numpy as np
import pytest

from engine.score.head_config import head_config_from_hf
from engine.score.labels import activate, classify_result
from engine.score.params import ClassifyParams

LABELS = {"0": "negative", "1": "neutral", "2": "positive"}


def head(num_labels=3, problem_type=None):
    labels = LABELS if num_labels == 3 else {str(index): f"LABEL_{index}" for index in range(num_labels)}
    return head_config_from_hf({"architectures": ["BertForSequenceClassification"], "model_type": "bert",
                                "id2label": labels, "problem_type": problem_type})


def test_activations():
    logits = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    softmax = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(activate(logits, "softmax"), softmax, rtol=1e-6)
    np.testing.assert_allclose(activate(logits, "sigmoid"), 1 / (1 + np.exp(-logits)), rtol=1e-6)
    np.testing.assert_array_equal(activate(logits, "none"), logits)
    assert activate(np.array([-1000.0, 1000.0]), "sigmoid").tolist() == [0.0, 1.0]     # no overflow


@pytest.mark.parametrize("num_labels, problem_type, params, logits, label, labels", [
    # Single-label: softmax, the best label.
    (3, None, ClassifyParams(), [0.0, 0.0, 2.0], "positive", ("positive",)),
    (3, "single_label_classification", ClassifyParams(), [3.0, 0.0, 2.0], "negative", ("negative",)),
    # Multi-label: sigmoid, every label reaching the threshold, best first.
    (3, "multi_label_classification", ClassifyParams(), [0.5, -2.0, 2.0], "positive", ("positive", "negative")),
    (3, "multi_label_classification", ClassifyParams(threshold=0.9), [0.5, -2.0, 2.0], "positive", ()),
    # The caller's activation wins over the config's.
    (3, None, ClassifyParams(activation="sigmoid", threshold=0.5), [0.5, -2.0, 2.0], "positive",
     ("positive", "negative")),
    # Equal scores: the first, as argmax.
    (3, None, ClassifyParams(), [1.0, 1.0, 0.0], "negative", ("negative",)),
])
def test_classify_result(num_labels, problem_type, params, logits, label, labels):
    result = classify_result(np.array(logits, dtype=np.float32), head(num_labels, problem_type), params, 7)
    assert (result.label, result.labels, result.num_tokens, result.scores) == (label, labels, 7, None)
    activation = params.activation if params.activation != "auto" else head(num_labels, problem_type).classify_activation
    assert result.score == pytest.approx(float(activate(np.array(logits, dtype=np.float32), activation).max()))


def test_a_one_label_head_gives_its_raw_value():
    result = classify_result(np.array([-3.25], dtype=np.float32), head(1), ClassifyParams(), 4)
    assert (result.label, result.score, result.labels) == (None, -3.25, ())
    assert classify_result(np.array([0.0], dtype=np.float32), head(1), ClassifyParams(activation="sigmoid"),
                           4).score == 0.5


def test_return_all_scores_names_every_label():
    result = classify_result(np.array([0.0, 0.0, 0.0], dtype=np.float32), head(), ClassifyParams(return_all_scores=True), 1)
    assert result.scores == pytest.approx({"negative": 1 / 3, "neutral": 1 / 3, "positive": 1 / 3})
