"""Whisper with FP8 weights, opt-in: the blocks' linear layers in FP8, the rest as
loaded, and the same words heard as in 16/32-bit."""

from __future__ import annotations

import pytest
import torch

from engine import Engine
from engine.layers.fp8_linear import Fp8Linear
from tests.support.speech import SENTENCES, espeak, has_espeak, word_error_rate
from tests.support.whisper_models import one_thread, tiny_en_path

pytestmark = pytest.mark.skipif(not has_espeak(), reason="needs espeak-ng for speech with known words")


@pytest.fixture(scope="module")
def engines():
    with one_thread():
        yield (Engine.from_pretrained(tiny_en_path(), mode="transcribe"),
               Engine.from_pretrained(tiny_en_path(), mode="transcribe", quantization="fp8"))


def test_only_the_blocks_linear_layers_take_fp8_weights(engines):
    plain, fp8 = engines
    model = fp8.transcriber.decoder.model
    swapped = sorted(name for name, module in model.named_modules() if isinstance(module, Fp8Linear))
    # tiny.en: 4 encoder blocks (q, k, v, out, two MLP), 4 decoder blocks (and cross-attention's four)
    assert len(swapped) == 4 * 6 + 4 * 10
    assert all(".blocks." in name for name in swapped)
    assert model.decoder.token_embedding.weight.dtype == torch.float32
    assert model.encoder.conv1.weight.dtype == torch.float32
    assert fp8.settings["quantization"] == "fp8" and plain.settings["quantization"] is None


def test_fp8_whisper_hears_the_same_words(engines):
    plain, fp8 = engines
    speech = [espeak(SENTENCES[4]), espeak(SENTENCES[6])]
    with one_thread():
        theirs, ours = plain.transcribe(speech), fp8.transcribe(speech)
    for sentence, reference, result in zip((SENTENCES[4], SENTENCES[6]), theirs, ours):
        assert result.error is None
        assert word_error_rate(sentence, result.text) <= 0.25
        assert word_error_rate(reference.text, result.text) <= 0.2


def test_an_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="unsupported quantization 'int4' for transcription"):
        Engine.from_pretrained(tiny_en_path(), mode="transcribe", quantization="int4")
