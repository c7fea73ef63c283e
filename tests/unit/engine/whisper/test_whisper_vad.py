"""Energy VAD and chunking, on synthetic audio: tone bursts for speech, zeros for pauses."""

import numpy as np
import pytest

from engine.whisper.audio import Audio
from engine.whisper.chunk import Chunk
from engine.whisper.vad import FRAME_SAMPLES, analyse, make_chunks, split_chunk

RATE = 16_000


def tone(seconds: float, level: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (level * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def pause(seconds: float, noise: float = 0.0) -> np.ndarray:
    return (noise * np.random.default_rng(0).standard_normal(int(seconds * RATE))).astype(np.float32)


def chunks(samples: np.ndarray, use_vad: bool = True) -> list[Chunk]:
    return make_chunks(analyse(Audio.from_array(samples)), use_vad)


def spans_s(samples: np.ndarray, use_vad: bool = True) -> list[tuple[float, float]]:
    """Each chunk's first and last file second."""
    return [(chunk.start / RATE, chunk.end / RATE) for chunk in chunks(samples, use_vad)]


def test_speech_between_silences_is_one_padded_chunk():
    [(start, end)] = spans_s(np.concatenate([pause(3), tone(2), pause(3)]))
    assert start == pytest.approx(2.8, abs=0.05) and end == pytest.approx(5.2, abs=0.05)


def test_nearby_regions_pack_up_to_thirty_seconds_with_long_pauses_cut_down():
    # 10 bursts of 3 s with 2.5-s pauses (52 s of audio): pauses keep 1 s, 7 bursts fit a window
    samples = np.concatenate([part for _ in range(10) for part in (tone(3), pause(2.5))])
    first, second = chunks(samples)
    assert len(first.pieces) == 7 and len(second.pieces) == 3
    assert all(chunk.num_samples <= 30 * RATE for chunk in (first, second))
    assert first.end <= second.start
    pauses = [(b[0] - a[1]) / RATE for a, b in zip(first.pieces, first.pieces[1:])]
    # a 2.5-s pause is 2.1 s between the padded regions; 1 s of it stays, 1.1 s is cut out
    assert all(p == pytest.approx(1.1, abs=0.05) for p in pauses)


def test_a_long_run_of_speech_is_cut_at_its_quietest_point():
    # 50 s of loud speech with one quiet dip at 24 s: the cut lands in the dip, not at 30 s
    samples = np.concatenate([tone(24), tone(0.2, level=0.01), tone(25.8)])
    spans = spans_s(samples)
    assert len(spans) == 2
    assert 24.0 <= spans[0][1] <= 24.2 and spans[1][0] == spans[0][1]


def test_silence_and_noise_floor_give_no_chunks():
    assert spans_s(pause(60)) == []
    assert spans_s(pause(20, noise=0.001)) == []


def test_without_vad_the_whole_file_is_covered_in_pieces_of_at_most_thirty_seconds():
    samples = np.concatenate([pause(10), tone(5), pause(50)])
    spans = spans_s(samples, use_vad=False)
    assert spans[0][0] == 0 and spans[-1][1] == pytest.approx(65.0)
    assert all(end - start <= 30.0 for start, end in spans)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_split_cuts_in_the_middle_half_at_the_quietest_frame():
    samples = np.concatenate([tone(5), pause(0.5), tone(3), tone(0.1, level=0.001), tone(6)])
    audio = Audio.from_array(samples)
    first, second = split_chunk(analyse(audio), Chunk(((0, len(samples)),)))
    assert first.start == 0 and second.end == len(samples) and first.end == second.start
    assert 5.0 <= first.end / RATE <= 5.5 and first.end % FRAME_SAMPLES == 0


def test_a_chunk_maps_its_times_back_to_the_file():
    chunk = Chunk(((1000, 3000), (10_000, 12_000)))
    assert chunk.num_samples == 4000 and chunk.to_file(500) == 1500 and chunk.to_file(2500) == 10_500
    assert chunk.to_file(2000) == 10_000 and chunk.to_file(2000, is_end=True) == 3000
    assert chunk.to_file(9999) == 12_000
    assert chunk.sub(1500, 2500).pieces == ((2500, 3000), (10_000, 10_500))
    audio = Audio.from_array(np.arange(13_000, dtype=np.float32) / 13_000)
    assert np.array_equal(chunk.samples(audio), np.concatenate([audio.samples(1000, 3000), audio.samples(10_000, 12_000)]))


def test_speech_seconds_in_a_stretch():
    speech = analyse(Audio.from_array(np.concatenate([pause(2), tone(2), pause(2)])))
    assert speech.speech_s(0, 6 * RATE) == pytest.approx(2.4, abs=0.05)
    assert speech.speech_s(5 * RATE, 6 * RATE) == 0
