"""Energy voice-activity detection: where each file is cut into chunks of <= 30 s.

No VAD model can be downloaded here (Silero, pyannote), so this one is energy-based:

1. frame energy: RMS in dBFS over 20 ms frames;
2. speech: frames louder than the noise floor (10th percentile) + 12 dB and than the
   loud level (99th percentile) - 45 dB, where the floor counts as no higher than 32 dB
   under the loud level (a file that is speech throughout has its floor in speech), and
   never quieter than -55 dBFS (hiss in a file without speech is not speech); pauses shorter than 0.3 s are bridged, bursts
   shorter than 0.1 s dropped, and each region padded by 0.2 s;
3. chunks: neighbouring regions are packed while the chunk stays within 30 s, pauses
   longer than 1 s cut down to 1 s (engine.whisper.chunk), so the encoder's fixed 30-s
   window carries speech, not silence; a region that is longer on its own
   is cut at its quietest frame in the last third of the window, which is a pause
   between words whenever there is one (never a fixed 30-s cut through a word).

With vad off, the whole file is one region and only step 3's cutting applies.
It is fooled by loud non-speech (music, noise): Whisper then hears it and, for noise,
its no-speech probability drops the chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.whisper.audio import BLOCK_SAMPLES, Audio
from engine.whisper.chunk import Chunk
from engine.whisper.config import SAMPLE_RATE

FRAME_SAMPLES = 320                 # 20 ms; divides BLOCK_SAMPLES, so blocks hold whole frames
FRAMES_PER_SECOND = SAMPLE_RATE // FRAME_SAMPLES
SILENCE_DB = -100.0                 # a frame of digital silence


@dataclass(frozen=True)
class VadOptions:
    max_chunk_s: float = 30.0
    min_cut_s: float = 20.0           # a long region is cut between min_cut_s and max_chunk_s
    max_pause_s: float = 1.0          # longer pauses inside a chunk are cut down to this
    min_silence_s: float = 0.3
    min_speech_s: float = 0.1
    pad_s: float = 0.2
    floor_margin_db: float = 12.0
    loud_range_db: float = 45.0
    min_floor_gap_db: float = 32.0
    min_speech_db: float = -55.0


def frame_energies(audio: Audio) -> np.ndarray:
    """[num_frames] RMS dBFS, block by block (a silent block costs nothing)."""
    per_block = BLOCK_SAMPLES // FRAME_SAMPLES
    parts = []
    for block in audio.blocks:
        if block is None:
            parts.append(np.full(per_block, SILENCE_DB, dtype=np.float32))
            continue
        usable = len(block) // FRAME_SAMPLES * FRAME_SAMPLES
        frames = block[:usable].reshape(-1, FRAME_SAMPLES)
        rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1))
        parts.append(np.maximum(20 * np.log10(np.maximum(rms, 1e-10)), SILENCE_DB).astype(np.float32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def speech_regions(energies: np.ndarray, options: VadOptions) -> list[tuple[int, int]]:
    """[(start_frame, end_frame)] of speech, bridged, filtered and padded."""
    if len(energies) == 0:
        return []
    floor, loud = np.percentile(energies, 10), np.percentile(energies, 99)
    if loud <= SILENCE_DB:
        return []
    floor = min(floor, loud - options.min_floor_gap_db)
    threshold = max(floor + options.floor_margin_db, loud - options.loud_range_db, options.min_speech_db)
    is_speech = energies > threshold
    regions = _runs(is_speech)
    regions = _bridge(regions, round(options.min_silence_s * FRAMES_PER_SECOND))
    min_frames, pad = round(options.min_speech_s * FRAMES_PER_SECOND), round(options.pad_s * FRAMES_PER_SECOND)
    padded = [(max(0, s - pad), min(len(energies), e + pad)) for s, e in regions if e - s >= min_frames]
    return _bridge(padded, 0)


@dataclass(frozen=True)
class FileSpeech:
    """What VAD found in one file; chunks are cut from it, and later questions about a
    stretch of the file (is there speech left after the transcript stopped?) read it."""

    energies: np.ndarray                   # [num_frames] dBFS
    regions: list[tuple[int, int]]         # speech, in frames
    num_samples: int

    def speech_s(self, start_sample: int, end_sample: int) -> float:
        """Seconds of speech between two sample positions."""
        start, end = start_sample / FRAME_SAMPLES, end_sample / FRAME_SAMPLES
        overlap = sum(max(0.0, min(e, end) - max(s, start)) for s, e in self.regions)
        return overlap / FRAMES_PER_SECOND


def analyse(audio: Audio, options: VadOptions = VadOptions()) -> FileSpeech:
    energies = frame_energies(audio)
    return FileSpeech(energies, speech_regions(energies, options), audio.num_samples)


def make_chunks(speech: FileSpeech, use_vad: bool = True, options: VadOptions = VadOptions()) -> list[Chunk]:
    """Chunks of <= max_chunk_s, in time order."""
    energies = speech.energies
    regions = speech.regions if use_vad else [(0, len(energies))]
    max_frames = round(options.max_chunk_s * FRAMES_PER_SECOND)
    min_cut = round(options.min_cut_s * FRAMES_PER_SECOND)
    pieces = [piece for region in regions for piece in _cut(region, energies, max_frames, min_cut)]
    chunks = []
    for frames in _pack(pieces, max_frames, round(options.max_pause_s * FRAMES_PER_SECOND)):
        # a piece reaching the last whole frame runs on to the file's last sample (a partial frame)
        samples = tuple((s * FRAME_SAMPLES, speech.num_samples if e >= len(energies) else e * FRAME_SAMPLES)
                        for s, e in frames)
        samples = tuple((s, e) for s, e in samples if e > s)
        if samples:
            chunks.append(Chunk(samples))
    return chunks


def split_chunk(speech: FileSpeech, chunk: Chunk) -> list[Chunk]:
    """Two halves of a chunk, cut at the quietest frame of its middle half (a re-chunk)."""
    energies = np.concatenate([speech.energies[s // FRAME_SAMPLES:-(-e // FRAME_SAMPLES)] for s, e in chunk.pieces])
    quarter = max(1, len(energies) // 4)
    middle = energies[quarter:len(energies) - quarter]
    cut = (quarter + int(np.argmin(middle)) if len(middle) else len(energies) // 2) * FRAME_SAMPLES
    cut = min(max(cut, 1), chunk.num_samples - 1)
    return [chunk.sub(0, cut), chunk.sub(cut, chunk.num_samples)]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def _bridge(regions: list[tuple[int, int]], max_gap: int) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in regions:
        if merged and start - merged[-1][1] <= max_gap:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _cut(region: tuple[int, int], energies: np.ndarray, max_frames: int, min_cut: int) -> list[tuple[int, int]]:
    """A region longer than max_frames, cut at the quietest frame in [min_cut, max_frames) of each window."""
    start, end = region
    pieces = []
    while end - start > max_frames:
        window = energies[start + min_cut:start + max_frames]
        cut = start + min_cut + int(np.argmin(window))
        pieces.append((start, cut))
        start = cut
    pieces.append((start, end))
    return pieces


def _pack(regions: list[tuple[int, int]], max_frames: int, max_pause: int) -> list[list[tuple[int, int]]]:
    """Regions (frames) -> chunks as lists of pieces, each chunk's pieces plus kept pauses
    within max_frames; a pause over max_pause keeps max_pause, split around the join."""
    chunks: list[list[tuple[int, int]]] = []
    for start, end in regions:
        if chunks:
            pieces = chunks[-1]
            gap = start - pieces[-1][1]
            length = sum(e - s for s, e in pieces) + min(gap, max_pause) + end - start
            if length <= max_frames:
                if gap <= max_pause:
                    pieces[-1] = (pieces[-1][0], end)
                else:
                    kept_after = max_pause // 2
                    pieces[-1] = (pieces[-1][0], pieces[-1][1] + kept_after)
                    pieces.append((start - (max_pause - kept_after), end))
                continue
        chunks.append([(start, end)])
    return chunks
