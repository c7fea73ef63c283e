"""Chunk: what one 30-s encoder window holds — stretches of one file, in order.

A chunk is usually one contiguous span. When VAD packs speech separated by a long
pause, the pause is cut down to `max_pause_s` (half kept after the speech before it,
half before the speech after it), so the window carries speech rather than silence:

    file   |speech|.....long pause.....|speech|
    chunk  |speech|..|               |..|speech|      two pieces, joined inside the pause

Times the model gives inside the chunk map back to the file through the pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.whisper.audio import Audio
from engine.whisper.config import SAMPLE_RATE


@dataclass(frozen=True)
class Chunk:
    pieces: tuple[tuple[int, int], ...]     # (start_sample, end_sample) of the file, in time order

    @property
    def start(self) -> int:
        return self.pieces[0][0]

    @property
    def end(self) -> int:
        return self.pieces[-1][1]

    @property
    def num_samples(self) -> int:
        return sum(end - start for start, end in self.pieces)

    def samples(self, audio: Audio) -> np.ndarray:
        return np.concatenate([audio.samples(start, end) for start, end in self.pieces])

    def to_file(self, offset: int, is_end: bool = False) -> int:
        """The file sample at `offset` samples into the chunk; at a join, a start maps to
        the next piece's first sample and an end to the last sample of the piece before."""
        for start, end in self.pieces:
            length = end - start
            if offset < length or (is_end and offset == length):
                return start + offset
            offset -= length
        return self.end

    def to_file_s(self, seconds: float, is_end: bool = False) -> float:
        return self.to_file(round(seconds * SAMPLE_RATE), is_end) / SAMPLE_RATE

    def sub(self, lo: int, hi: int) -> "Chunk":
        """The part of the chunk between chunk offsets lo and hi."""
        pieces, position = [], 0
        for start, end in self.pieces:
            length = end - start
            a, b = max(lo, position), min(hi, position + length)
            if a < b:
                pieces.append((start + a - position, start + b - position))
            position += length
        return Chunk(tuple(pieces))
