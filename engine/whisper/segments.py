"""Timestamp tokens -> segments of one chunk, on the file's time line.

Whisper writes <|t0|> text <|t1|><|t1'|> text <|t2|> ...: each segment opens and closes
with a timestamp (seconds from the chunk's start, 0.02-s steps). Text after the last
closing timestamp, or a chunk decoded without timestamps, runs to the chunk's end.
"""

from __future__ import annotations

from engine.whisper.config import SECONDS_PER_TIMESTAMP
from engine.whisper.outputs import Segment
from engine.whisper.tokenizer import WhisperTokenizer


def chunk_segments(tokens: list[int], tokenizer: WhisperTokenizer, offset_s: float, duration_s: float) -> list[Segment]:
    return [_segment(tokenizer, text_tokens, offset_s + start, offset_s + end)
            for start, end, text_tokens in token_segments(tokens, tokenizer, duration_s)]


def token_segments(tokens: list[int], tokenizer: WhisperTokenizer, duration_s: float) -> list[tuple[float, float, list[int]]]:
    """(start, end, text tokens) of each segment with text, seconds from the chunk's start."""
    begin = tokenizer.timestamp_begin
    segments, text_tokens, opened_at = [], [], 0.0
    for token in tokens:
        if token < begin:
            text_tokens.append(token)
            continue
        time_s = min((token - begin) * SECONDS_PER_TIMESTAMP, duration_s)
        if text_tokens:
            segments.append((opened_at, time_s, text_tokens))
            text_tokens = []
        opened_at = time_s
    if text_tokens:
        segments.append((opened_at, duration_s, text_tokens))
    return [(start, end, ids) for start, end, ids in segments if tokenizer.decode(ids).strip()]


def _segment(tokenizer: WhisperTokenizer, text_tokens: list[int], start: float, end: float) -> Segment:
    return Segment(round(start, 3), round(max(start, end), 3), tokenizer.decode(text_tokens).strip())
