"""Word timestamps and language detection against openai-whisper on the real Whisper base
and tiny.en weights: transcribe(word_timestamps=True) on every ALSA clip and on espeak-ng
sentences (punctuation, quotes, brackets) gives the same words, as many, at the same
times within 0.02 s; language=None reports the language and probability that
openai-whisper's detect_language gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import whisper

from engine import Engine
from engine.whisper.audio import load_audio
from engine.whisper.config import N_SAMPLES_PER_CHUNK
from tests.support import whisper_models
from tests.support.reference_cache import computed_once
from tests.support.speech import ALSA_DIR, espeak, has_espeak
from tests.support.whisper_models import base_path, encode_each_window_once, one_thread, openai_reference, tiny_en_path

MAX_TIME_ERROR_S = 0.02
ESPEAK_TEXTS = ["The quick brown fox jumps over the lazy dog.",
                "Hello, world! \"Quoted\" text (in brackets), isn't it?",
                "We carried the heavy boxes into the old wooden house; then, at last, we rested."]
LANGUAGE_TEXTS = {"en": ("en-us", "The children played in the garden until the sun went down."),
                  "de": ("de", "Die Kinder spielten im Garten, bis die Sonne unterging."),
                  "fr": ("fr", "Les enfants jouaient dans le jardin jusqu'au coucher du soleil."),
                  "es": ("es", "Los niños jugaron en el jardín hasta que se puso el sol.")}
MODELS = {"base": base_path, "tiny.en": tiny_en_path}


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    assert has_espeak(), "apt-get install espeak-ng"
    audio = {path.name: _samples(path) for path in sorted(ALSA_DIR.glob("*.wav"))}
    assert len(audio) == 9, "apt-get install alsa-utils: /usr/share/sounds/alsa/*.wav"
    audio.update({text: espeak(text) for text in ESPEAK_TEXTS})
    return audio


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request):
    """(model name, Barge's engine, openai-whisper's words for each clip). openai-whisper, with
    the same tensors and its known alignment heads, runs only when no earlier run computed its
    words on the same clips and weights (tests.support.reference_cache)."""
    name = request.param
    path = MODELS[name]()

    def reference_words(clips: dict[str, np.ndarray]) -> dict[str, list[dict]]:
        def compute() -> dict[str, list[dict]]:
            reference = openai_reference(path)
            reference.set_alignment_heads(whisper._ALIGNMENT_HEADS[name])
            encode_each_window_once(reference)
            return {clip: _reference_words(reference, samples) for clip, samples in clips.items()}
        return computed_once(f"whisper-{name}-words", compute, inputs=clips, weights=path,
                             libraries=("openai-whisper",), sources=(__file__, whisper_models.__file__))
    with one_thread():
        yield name, Engine.from_pretrained(path, mode="transcribe"), reference_words


def _samples(path) -> np.ndarray:
    audio = load_audio(path)
    return audio.samples(0, audio.num_samples)


def _reference_words(reference, samples: np.ndarray) -> list[dict]:
    result = whisper.transcribe(reference, samples, language="en", word_timestamps=True, fp16=False)
    return [word for segment in result["segments"] for word in segment["words"]]


def test_words_and_times_match_openai_whisper(pair, clips):
    name, asr, reference_words = pair
    # VAD off: a clip is one window from its first sample, as openai-whisper's first window is
    outputs = asr.transcribe(list(clips.values()), language="en", vad=False, word_timestamps=True)
    words = reference_words(clips)
    num_words = 0
    for clip, output in zip(clips, outputs):
        theirs = words[clip]
        ours = [word for segment in output.segments for word in segment.words]
        assert [w.word for w in ours] == [w["word"] for w in theirs], f"{name} {clip}"
        for mine, expected in zip(ours, theirs):
            assert abs(mine.start - expected["start"]) <= MAX_TIME_ERROR_S, (name, clip, mine, expected)
            assert abs(mine.end - expected["end"]) <= MAX_TIME_ERROR_S, (name, clip, mine, expected)
            assert mine.probability == pytest.approx(expected["probability"], abs=1e-3), (name, clip, mine)
        num_words += len(ours)
    assert num_words >= 2 * 8 + 20      # every voice clip says two words; Noise.wav none


def test_words_with_vad_stay_inside_their_segments_and_in_order(pair, clips):
    _, asr, _ = pair
    [output] = asr.transcribe([np.concatenate([clips[ESPEAK_TEXTS[0]], np.zeros(3 * 16_000, np.float32),
                                               clips[ESPEAK_TEXTS[2]]])], language="en", word_timestamps=True)
    words = [word for segment in output.segments for word in segment.words]
    assert "".join(w.word for w in words).strip() == output.text
    assert all(0 <= w.start <= w.end <= output.duration_s for w in words)
    assert [w.start for w in words] == sorted(w.start for w in words)
    second = next(w for w in words if "carried" in w.word)
    assert second.start > len(clips[ESPEAK_TEXTS[0]]) / 16_000 + 2.0    # after the 3-s pause
    without = asr.transcribe([clips[ESPEAK_TEXTS[0]]], language="en")[0]
    assert all(segment.words is None for segment in without.segments)


def test_detected_language_and_probability_match_openai_whisper():
    path = base_path()
    clips = {code: espeak(text, voice=voice) for code, (voice, text) in LANGUAGE_TEXTS.items()}
    with one_thread():
        asr = Engine.from_pretrained(path, mode="transcribe")
        # one greedy decode, no temperature fallbacks: the language is detected before any
        # decoding (and espeak-ng's French and Spanish set off all five fallbacks: 155 s of 2
        # loaded cores), the transcript is not what this test checks
        outputs = asr.transcribe(list(clips.values()), language=None, vad=False, temperature=(0.0,))
    def reference_probs() -> list[dict[str, float]]:
        mels = torch.stack([whisper.log_mel_spectrogram(torch.from_numpy(samples), padding=N_SAMPLES_PER_CHUNK)[:, :3000]
                            for samples in clips.values()])
        with torch.inference_mode():
            return whisper.detect_language(openai_reference(path), mels)[1]
    probs = computed_once("whisper-base-languages", reference_probs, inputs=clips, weights=path,
                          libraries=("openai-whisper",), sources=(__file__, whisper_models.__file__))
    for (code, samples), output, expected in zip(clips.items(), outputs, probs):
        assert output.language == max(expected, key=expected.get), code
        if code in ("en", "de"):     # espeak-ng's French and Spanish fool Whisper base (it hears 'vi', say)
            assert output.language == code
        assert output.language_probability == pytest.approx(expected[output.language], abs=1e-3), code
    given = asr.transcribe([clips["de"]], language="de", vad=False, temperature=(0.0,))[0]
    assert given.language == "de" and given.language_probability is None
