"""Audio nobody should have sent: every row still gets a clear result, the good rows
beside them are transcribed, and a two-hour file of silence costs no memory to speak of."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from engine import Engine
from tests.support.audio_files import encode, write_silence_wav
from tests.support.speech import SENTENCES, espeak, word_error_rate
from tests.support.whisper_models import one_thread, tiny_en_path


@pytest.fixture(scope="module")
def asr():
    with one_thread():
        yield Engine.from_pretrained(tiny_en_path(), mode="transcribe")


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return espeak(SENTENCES[4])


def test_each_bad_row_gets_its_own_error_and_nothing_is_lost(asr, speech, tmp_path):
    good = tmp_path / "good.flac"
    good.write_bytes(encode(speech, "flac"))
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    text_file = tmp_path / "notes.wav"
    text_file.write_text("these are meeting notes, not audio\n" * 20)
    mp3 = encode(speech, "mp3")
    rows = [str(good), mp3[:len(mp3) // 2], str(empty), str(text_file), b"", None,
            str(tmp_path / "missing.wav"), 42, encode(speech, "ogg"), encode(speech, "m4a")[:500]]
    results = asr.transcribe(rows)
    assert len(results) == len(rows)
    good_result, truncated, empty_file, text_wav, no_bytes, null, missing, number, opus, cut_m4a = results
    assert word_error_rate(SENTENCES[4], good_result.text) <= 0.25 and good_result.error is None
    assert word_error_rate(SENTENCES[4], opus.text) <= 0.25 and opus.error is None
    # a truncated MP3 keeps what decodes: the first half of the sentence
    assert truncated.error is None and 0 < truncated.duration_s < len(speech) / 16_000
    assert truncated.text.lower().startswith("please close")
    assert empty_file.error == f"audio file is empty (0 bytes): {empty}"
    assert text_wav.error.startswith(f"{text_file} is not decodable audio")
    assert no_bytes.error == "audio is empty (0 bytes)"
    assert null.error == "audio is null"
    assert missing.error == f"audio file not found: {tmp_path / 'missing.wav'}"
    assert number.error == "audio must be bytes, a path or URL, or a float32 array, not int"
    assert cut_m4a.error is not None and "not decodable" in cut_m4a.error
    for result in (empty_file, text_wav, no_bytes, null, missing, number, cut_m4a):
        assert result.text is None and result.segments == []


def test_two_hours_of_silence_is_an_empty_transcript_in_bounded_memory(asr, speech, tmp_path):
    silent = write_silence_wav(tmp_path / "silence.wav", seconds=2 * 3600)
    tracemalloc.start()
    try:
        silent_result, spoken = asr.transcribe([str(silent), speech])
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert silent_result.error is None and silent_result.text == "" and silent_result.segments == []
    assert silent_result.duration_s == pytest.approx(7200.0)
    assert word_error_rate(SENTENCES[4], spoken.text) <= 0.25
    # 2 h at 16 kHz is 460 MB of float32; silence is kept as nothing (engine.whisper.audio)
    assert peak_bytes < 64 * 2**20, f"peak {peak_bytes / 2**20:.0f} MiB"
