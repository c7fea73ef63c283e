"""Word timings of one chunk → words per segment, tidied as openai-whisper tidies them.

    alignment (engine.whisper.alignment) → long words at sentence ends cut to 2 × median
    → punctuation merged into its word → words handed to their segments by token count
    → the first word after a pause and a segment's outer words kept from running long
    → each segment's start and end moved to its words' (unless its own are more believable)

These are the reference's heuristics (timing.add_word_timestamps), with its constants;
times are seconds from the chunk's start, rounded to 0.01 s as the reference rounds them.
Pure: no model here, so every rule can be tested on fabricated timings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.whisper.alignment import WordTiming
from engine.whisper.outputs import Word

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
MAX_MEDIAN_WORD_S = 0.7


@dataclass
class TimedSegment:
    """A segment of one chunk while its words are placed; start and end may move to them."""

    start: float
    end: float
    text_tokens: list[int]
    words: list[Word] | None = None     # None until timed


def place_words(alignment: list[WordTiming], segments: list[TimedSegment], last_speech_s: float) -> float:
    """Give each segment its words (in place); returns the end of the last speech heard,
    for the next chunk's `last_speech_s`."""
    if not segments:
        return last_speech_s
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median = min(MAX_MEDIAN_WORD_S, float(np.median(durations))) if len(durations) else 0.0
    max_duration = median * 2
    if len(durations):
        _cut_sentence_ends(alignment, max_duration)
    merge_punctuations(alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    index = 0
    for segment in segments:
        words, num_tokens = [], 0
        while index < len(alignment) and num_tokens < len(segment.text_tokens):
            timing = alignment[index]
            if timing.word:
                words.append([timing.word, round(timing.start, 2), round(timing.end, 2), timing.probability])
            num_tokens += len(timing.tokens)
            index += 1
        if words:
            _tidy_outer_words(words, segment, last_speech_s, median, max_duration)
            last_speech_s = segment.end
        segment.words = [Word(text, start, end, probability) for text, start, end, probability in words]
    return last_speech_s


def _cut_sentence_ends(alignment: list[WordTiming], max_duration: float) -> None:
    """A word at a sentence boundary may not last over twice the median word."""
    for i in range(1, len(alignment)):
        timing = alignment[i]
        if timing.end - timing.start > max_duration:
            if timing.word in SENTENCE_END_MARKS:
                timing.end = timing.start + max_duration
            elif alignment[i - 1].word in SENTENCE_END_MARKS:
                timing.start = timing.end - max_duration


def merge_punctuations(alignment: list[WordTiming], prepended: str, appended: str) -> None:
    """Opening punctuation joins the word after it, closing punctuation the word before;
    the absorbed entry keeps its place with no word and no tokens."""
    following = len(alignment) - 1
    for i in range(len(alignment) - 2, -1, -1):
        previous, after = alignment[i], alignment[following]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            after.word, after.tokens = previous.word + after.word, previous.tokens + after.tokens
            previous.word, previous.tokens = "", []
        else:
            following = i
    previous_index = 0
    for j in range(1, len(alignment)):
        previous, after = alignment[previous_index], alignment[j]
        if not previous.word.endswith(" ") and after.word in appended:
            previous.word, previous.tokens = previous.word + after.word, previous.tokens + after.tokens
            after.word, after.tokens = "", []
        else:
            previous_index = j


def _tidy_outer_words(words: list[list], segment: TimedSegment, last_speech_s: float, median: float,
                      max_duration: float) -> None:
    """words: [text, start, end, probability] lists, changed in place; so is segment."""
    first, last = words[0], words[-1]
    # the first (and second) word after a pause must not swallow the pause
    if first[2] - last_speech_s > median * 4 and (
            first[2] - first[1] > max_duration or (len(words) > 1 and words[1][2] - first[1] > max_duration * 2)):
        if len(words) > 1 and words[1][2] - words[1][1] > max_duration:
            boundary = max(words[1][2] / 2, words[1][2] - max_duration)
            first[2] = words[1][1] = boundary
        first[1] = max(0, first[2] - max_duration)
    if segment.start < first[2] and segment.start - 0.5 > first[1]:
        first[1] = max(0, min(first[2] - median, segment.start))
    else:
        segment.start = first[1]
    if segment.end > last[1] and segment.end + 0.5 < last[2]:
        last[2] = max(last[1] + median, segment.end)
    else:
        segment.end = last[2]
