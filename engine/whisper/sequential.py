"""Sequential long-form decoding, as openai-whisper's transcribe does it (long_form="sequential").

    seek = 0 → window [seek, seek + 30 s) → decode, prompted with the file's text so far
             → segments from its timestamps → seek moves to the last closed timestamp
               (or past the window when it ended on a single timestamp) → next window

Each window is conditioned on the previous text (<|startofprev|> then up to 223 of the
file's earlier tokens, timestamps included), so names, spelling and punctuation carry
over; a window decoded above temperature 0.5 resets that history. A file's windows are
decoded one after another, but windows of different files decode together.

Pure: the window arithmetic here is table-testable; engine.whisper.transcriber runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.whisper.config import HOP_LENGTH, N_SAMPLES_PER_CHUNK, SECONDS_PER_TIMESTAMP

N_FRAMES = N_SAMPLES_PER_CHUNK // HOP_LENGTH     # 3000 mel frames in a window
FRAMES_PER_TIMESTAMP = 2
MAX_PROMPT_TOKENS = 223                          # openai-whisper: n_text_ctx // 2 - 1
PROMPT_RESET_TEMPERATURE = 0.5


@dataclass
class SequentialState:
    """One file's progress: where the next window starts, and the text tokens so far."""

    num_frames: int                      # mel frames of the whole file (10 ms each)
    seek: int = 0                        # first frame of the next window
    all_tokens: list[int] = field(default_factory=list)
    prompt_from: int = 0                 # all_tokens[prompt_from:] may prompt the next window

    @property
    def is_done(self) -> bool:
        return self.seek >= self.num_frames

    @property
    def window_frames(self) -> int:
        return min(N_FRAMES, self.num_frames - self.seek)

    @property
    def prompt(self) -> list[int]:
        return self.all_tokens[self.prompt_from:][-MAX_PROMPT_TOKENS:]

    def skip_window(self) -> None:
        self.seek += self.window_frames

    def advance(self, tokens: list[int], timestamp_begin: int, temperature: float,
                has_text: Callable[[list[int]], bool]) -> list[tuple[float, float, list[int]]]:
        """A window decoded to `tokens` (eot excluded): its segments with text and length
        as (start, end, tokens) in seconds from the window's start, the seek moved on, the
        prompt history grown by them (the reference drops the others from it too)."""
        segments, frames_used = window_segments(tokens, timestamp_begin, self.window_frames)
        segments = [(start, end, ids) for start, end, ids in segments if end != start and has_text(ids)]
        self.seek += frames_used
        self.all_tokens += [t for _, _, segment_tokens in segments for t in segment_tokens]
        if temperature > PROMPT_RESET_TEMPERATURE:
            self.prompt_from = len(self.all_tokens)
        return segments


def window_segments(tokens: list[int], timestamp_begin: int,
                    window_frames: int) -> tuple[list[tuple[float, float, list[int]]], int]:
    """(segments, frames the seek moves). Segments run between consecutive timestamp
    tokens; text after the last closed pair is left for the next window, unless the
    window ended on a single timestamp (nothing more is said in it)."""
    is_timestamp = [t >= timestamp_begin for t in tokens]
    single_ending = is_timestamp[-2:] == [False, True]
    cuts = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]

    def seconds(token: int) -> float:
        return (token - timestamp_begin) * SECONDS_PER_TIMESTAMP

    if not cuts:
        timestamps = [t for t in tokens if t >= timestamp_begin]
        duration = window_frames * HOP_LENGTH / 16_000
        if timestamps and timestamps[-1] != timestamp_begin:
            duration = seconds(timestamps[-1])
        return [(0.0, duration, list(tokens))], window_frames
    if single_ending:
        cuts.append(len(tokens))
    segments, last = [], 0
    for cut in cuts:
        piece = tokens[last:cut]
        segments.append((seconds(piece[0]), seconds(piece[-1]), list(piece)))
        last = cut
    if single_ending:
        return segments, window_frames
    return segments, (tokens[last - 1] - timestamp_begin) * FRAMES_PER_TIMESTAMP
