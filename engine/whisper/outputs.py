"""What transcription hands back: one TranscriptionOutput per input, in input order."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Word:
    word: str            # as Whisper spells it: a leading space before most words, punctuation merged in
    start: float         # seconds from the start of the file
    end: float
    probability: float   # the mean of its tokens' probabilities


@dataclass(frozen=True)
class Segment:
    start: float      # seconds from the start of the file
    end: float
    text: str         # stripped of the leading space Whisper puts before each word
    words: tuple[Word, ...] | None = None   # with word_timestamps=True (else None), in time order


@dataclass(frozen=True)
class TranscriptionOutput:
    text: str | None                  # the segments' text joined; None when error is set
    segments: list[Segment] = field(default_factory=list)   # in time order, inside [0, duration_s]
    language: str | None = None       # given, or detected on the file's first chunk
    language_probability: float | None = None   # when detected: the model's probability of that language
    duration_s: float | None = None   # of the decoded audio; None when it could not be decoded
    error: str | None = None          # why this input has no transcript ("audio is empty (0 bytes)", ...)
    num_tokens: int = 0               # tokens the decoder produced, every fallback attempt included

    @property
    def is_ok(self) -> bool:
        return self.error is None
