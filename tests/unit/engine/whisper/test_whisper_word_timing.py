"""The pure pieces of word timing against openai-whisper's own: DTW paths (ties
included), the median filter, punctuation merging and how tokens are split into words."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import whisper.timing as reference_timing
from whisper.tokenizer import get_tokenizer

from engine.whisper.alignment import WordTiming
from engine.whisper.dtw import dtw, median_filter
from engine.whisper.words import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS, merge_punctuations


@pytest.mark.parametrize("shape, rounded", [((1, 1), False), ((1, 7), False), ((7, 1), False), ((4, 4), True),
                                            ((30, 90), True), ((60, 700), False), ((120, 1500), False)])
def test_dtw_takes_the_reference_path(shape, rounded):
    cost = np.random.default_rng(sum(shape)).standard_normal(shape)
    if rounded:     # many equal costs: the tie rules decide the path
        cost = np.round(cost)
    assert np.array_equal(np.stack(dtw(cost)), reference_timing.dtw_cpu(cost))


def test_dtw_path_is_monotonic_and_covers_every_row_and_column():
    rows, cols = dtw(np.random.default_rng(1).standard_normal((12, 50)))
    assert rows[0] == cols[0] == 0 and rows[-1] == 11 and cols[-1] == 49
    assert np.all(np.diff(rows) >= 0) and np.all(np.diff(cols) >= 0)
    assert np.all(np.diff(rows) + np.diff(cols) >= 1)


@pytest.mark.parametrize("frames", [2, 3, 4, 9, 300])
def test_median_filter_matches_the_reference(frames):
    x = torch.randn(3, 5, frames)
    assert torch.equal(median_filter(x, 7), reference_timing.median_filter(x, 7))


def test_median_filter_refuses_an_even_width():
    with pytest.raises(ValueError, match="odd"):
        median_filter(torch.zeros(1, 1, 9), 4)


@pytest.mark.parametrize("words", [
    [" Hello", ",", " world", "!"],
    [" \"", "Quoted", "\"", " text", " (", "in", " brackets", ")", ".", ""],
    [" It", " costs", " $", "5", ".", "", " Really", "?", "!"],
    [" (", " [", "x", "]", ")", " -", "y", "."],
])
def test_punctuation_merges_as_the_reference_merges(words):
    ours = [WordTiming(w, [i], i * 0.1, i * 0.1 + 0.1, 0.5) for i, w in enumerate(words)]
    theirs = [reference_timing.WordTiming(w, [i], i * 0.1, i * 0.1 + 0.1, 0.5) for i, w in enumerate(words)]
    merge_punctuations(ours, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    reference_timing.merge_punctuations(theirs, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    assert [(w.word, w.tokens) for w in ours] == [(w.word, w.tokens) for w in theirs]


@pytest.mark.parametrize("language, text", [
    ("en", " Hello, world! \"Quoted\" text (in brackets), isn't it? Well-known; 3.5 km."),
    ("de", " Größere Übungen kosten 12,50 €."),
    ("ja", "こんにちは世界、元気ですか。"),
    ("zh", "我们今天去公园散步吧！"),
])
def test_words_split_as_the_reference_splits_them(whisper_tokenizer, language, text):
    reference = get_tokenizer(True, language=language)
    tokens = reference.encode(text) + [reference.eot]
    words, word_tokens = whisper_tokenizer.split_to_word_tokens(tokens, language)
    expected_words, expected_tokens = reference.split_to_word_tokens(tokens)
    assert word_tokens == expected_tokens
    assert words[:-1] == expected_words[:-1]      # the closing eot's text is never used


@pytest.fixture(scope="module")
def whisper_tokenizer():
    from engine.whisper.loader import load_checkpoint
    from engine.whisper.tokenizer import WhisperTokenizer
    from tests.support.whisper_models import base_path
    checkpoint = load_checkpoint(base_path())
    return WhisperTokenizer(checkpoint.config, checkpoint.folder)
