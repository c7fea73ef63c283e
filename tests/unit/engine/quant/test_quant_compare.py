"""The FP8 check's comparisons on fabricated engine outputs: which rows count, and the figures."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.embed.outputs import EmbeddingOutput
from engine.quant.compare import compare, word_error_rate


class FakeEngine:
    """Hands back fixed outputs, as a loaded engine of `mode` would."""

    def __init__(self, mode: str, outputs: list, quantization: str | None = None):
        self.mode, self.outputs = mode, outputs
        self.settings = {"dtype": "float32", "quantization": quantization}
        self.calls = []

    def encode(self, texts, **params):
        self.calls.append((texts, params))
        return self.outputs

    def transcribe(self, audio, **params):
        self.calls.append((audio, params))
        return self.outputs


def _embedding(*values, error=None):
    return EmbeddingOutput(None if error else np.array(values, dtype=np.float32), 3, error)


def test_embed_cosines_leave_out_rows_either_engine_refused():
    baseline = FakeEngine("embed", [_embedding(1, 0), _embedding(1, 1), _embedding(error="text is null")])
    fp8 = FakeEngine("embed", [_embedding(2, 0), _embedding(1, 0), _embedding(error="text is null")], "fp8")
    check = compare(baseline, fp8, ["a", "b", None], {"dimensions": 2})
    assert check.num_rows == 2 and check.quantization == "fp8" and check.baseline_dtype == "float32"
    assert check.cosine_mean == pytest.approx((1 + 2 ** -0.5) / 2)
    assert check.cosine_min == pytest.approx(2 ** -0.5)
    assert fp8.calls == [(["a", "b", None], {"dimensions": 2})]      # the job's own params
    assert set(check.to_dict()) == {"mode", "quantization", "baseline_dtype", "num_rows", "cosine_mean",
                                    "cosine_min", "recipe"}       # no model to show what it kept
    assert check.recipe.startswith("fp8, ") and " scales, 16-bit: " in check.recipe


def test_transcripts_are_scored_against_the_unquantized_ones():
    said = SimpleNamespace
    baseline = FakeEngine("transcribe", [said(text="Close the window.", error=None),
                                         said(text="the boat was tied", error=None),
                                         said(text="", error="audio is null")])
    fp8 = FakeEngine("transcribe", [said(text="close the window", error=None),
                                    said(text="the goat was tied", error=None),
                                    said(text="", error="audio is null")], "fp8")
    check = compare(baseline, fp8, [b"a", b"b", None], {"language": "en"})
    assert (check.num_rows, check.wer_mean, check.wer_max) == (2, 0.125, 0.25)


def test_a_check_with_no_comparable_row_says_so():
    baseline = FakeEngine("embed", [_embedding(error="text is null")])
    with pytest.raises(ValueError, match="nothing to compare"):
        compare(baseline, FakeEngine("embed", [_embedding(error="text is null")], "fp8"), [None], {})


@pytest.mark.parametrize("reference, hypothesis, rate", [
    ("the quick brown fox", "the quick brown fox", 0.0),
    ("The quick, brown fox!", "the quick brown fox", 0.0),     # case and punctuation ignored
    ("the quick brown fox", "the quick fox", 0.25),           # a deletion
    ("the quick brown fox", "a quick brown fox jumps", 0.5),  # a substitution and an insertion
    ("", "", 0.0),
    ("", "noise", 1.0),
    ("größe straße", "größe strasse", 0.5),                   # words are Unicode, not ASCII
])
def test_word_error_rate(reference, hypothesis, rate):
    assert word_error_rate(reference, hypothesis) == rate
