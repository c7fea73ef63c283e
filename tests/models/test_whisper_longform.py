"""Long-form transcription on the real Whisper tiny.en weights: VAD chunks, chunks of
many files decoded together, transcripts stitched back per file in time order."""

from __future__ import annotations

import numpy as np
import pytest

from engine import Engine
from tests.support.speech import ALSA_DIR, SENTENCES, espeak, has_espeak, long_form, silence, word_error_rate
from tests.support.whisper_models import one_thread, tiny_en_path

GAPS_S = [1.0, 2.5, 1.5, 3.5, 0.8]
MAX_WER = 0.10


@pytest.fixture(scope="module")
def asr():
    with one_thread():
        yield Engine.from_pretrained(tiny_en_path(), mode="transcribe")


@pytest.fixture(scope="module")
def long_audio() -> np.ndarray:
    assert has_espeak(), "apt-get install espeak-ng"
    return long_form(SENTENCES, GAPS_S)


def test_a_three_minute_file_keeps_its_words_in_order(asr, long_audio):
    duration_s = len(long_audio) / 16_000
    assert 180 <= duration_s <= 300
    [result] = asr.transcribe([long_audio])
    assert result.error is None and result.language == "en"
    assert result.duration_s == pytest.approx(duration_s, abs=0.01)
    wer = word_error_rate(" ".join(SENTENCES), result.text)
    assert wer <= MAX_WER, f"WER {wer:.3f}: {result.text}"
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts) and len(result.segments) >= len(SENTENCES) * 0.8
    assert all(0 <= s.start <= s.end <= duration_s for s in result.segments)
    assert all(a.end <= b.start + 1e-6 for a, b in zip(result.segments, result.segments[1:]))
    # the first and last sentences land near where they were spoken
    assert result.segments[0].start < 2.0 and result.segments[-1].end > duration_s - 6


def test_files_batched_together_read_as_they_do_alone(asr):
    files = [
        np.concatenate([silence(0.3), espeak(SENTENCES[1])]),
        _alsa("Front_Left.wav"),
        np.concatenate([espeak(" ".join(SENTENCES[2:6])), silence(3.5), espeak(" ".join(SENTENCES[6:11]))]),
        # over 30 s: two chunks
        np.concatenate([espeak(SENTENCES[20]), silence(4.0), espeak(SENTENCES[21])]),
    ]
    assert len(files[2]) > 30 * 16_000
    together = asr.transcribe(files)
    for audio, batched in zip(files, together):
        [alone] = asr.transcribe([audio])
        assert batched.text == alone.text and batched.segments == alone.segments
        assert batched.error is None and batched.text
    assert word_error_rate(" ".join(SENTENCES[2:11]), together[2].text) <= MAX_WER


def _alsa(name: str) -> np.ndarray:
    from engine.whisper.audio import load_audio
    audio = load_audio(ALSA_DIR / name)
    return audio.samples(0, audio.num_samples)


def test_sequential_long_form_is_as_good_as_openai_whisper(asr):
    """long_form="sequential" on a ~60-s recording of two voices with short and long
    pauses: its word error rate is within 0.01 of openai-whisper's transcribe on the same
    tiny.en weights (the full comparison, >= 5 minutes, is bench/transcribe_bench.py)."""
    import whisper
    from tests.support.whisper_models import openai_reference
    sentences = SENTENCES[:12]
    parts = [silence(0.4)]
    for i, sentence in enumerate(sentences):
        parts += [espeak(sentence, voice="en-gb" if i % 3 == 2 else "en-us", speed_wpm=140 + 10 * (i % 4)),
                  silence(GAPS_S[i % len(GAPS_S)] * (0.4 if i % 2 else 1.0))]
    audio = np.concatenate(parts)
    assert 45 <= len(audio) / 16_000 <= 90
    [ours] = asr.transcribe([audio], long_form="sequential")
    theirs = whisper.transcribe(openai_reference(tiny_en_path()), audio, fp16=False)
    expected = " ".join(sentences)
    assert word_error_rate(expected, ours.text) <= word_error_rate(expected, theirs["text"]) + 0.01, (
        ours.text, theirs["text"])
    starts = [s.start for s in ours.segments]
    assert starts == sorted(starts) and all(0 <= s.start <= s.end <= ours.duration_s for s in ours.segments)
