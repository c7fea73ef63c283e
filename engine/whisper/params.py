"""TranscribeParams: what a caller may choose per transcribe() call, checked in one place."""

from __future__ import annotations

from dataclasses import dataclass

from engine.whisper.tokenizer import LANGUAGE_CODES, TASKS

FALLBACK_STEP = 0.2     # openai-whisper's temperature_increment_on_fallback
MAX_BEAM_SIZE = 16
LONG_FORMS = ("vad", "sequential")


@dataclass(frozen=True)
class TranscribeParams:
    language: str | None = None        # None: detect per file (from its first chunk)
    task: str = "transcribe"           # or "translate" (to English)
    temperature: float | tuple[float, ...] = 0.0
    """The first decoding temperature, then fallbacks in 0.2 steps up to 1.0; or the
    exact sequence of temperatures to try."""
    beam_size: int = 1
    """1: greedy; N > 1: beam search with N hypotheses at temperature 0 (fallbacks above 0
    sample, as openai-whisper's transcribe does)."""
    vad: bool = True                   # False: cut only to fit 30 s, keep silences
    with_timestamps: bool = True       # False: one segment per chunk
    long_form: str = "vad"
    """How a file is cut into 30-s windows. "vad": at pauses found by the energy VAD, long
    pauses shortened, every window of every file decoded at once (fast). "sequential":
    openai-whisper's way, each window starting where the last one's text ended and
    conditioned on the text before it (engine.whisper.sequential); vad is then unused."""
    word_timestamps: bool = False
    """True: every segment gets its words with start, end and probability, timed from the
    alignment heads' cross-attention by dynamic time warping (engine.whisper.alignment)."""

    def __post_init__(self) -> None:
        if isinstance(self.temperature, list):
            object.__setattr__(self, "temperature", tuple(self.temperature))
        if self.language is not None and self.language not in LANGUAGE_CODES:
            raise ValueError(f"language must be a language code such as 'en' or 'de' (or None to detect it), "
                             f"got {self.language!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        temperatures = self.temperature if isinstance(self.temperature, tuple) else (self.temperature,)
        if not temperatures or any(isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 2
                                   for t in temperatures):
            raise ValueError(f"temperature must be a number in [0, 2] or a list of them, got {self.temperature!r}")
        if isinstance(self.beam_size, bool) or not isinstance(self.beam_size, int) or not 1 <= self.beam_size <= MAX_BEAM_SIZE:
            raise ValueError(f"beam_size must be an integer from 1 (greedy) to {MAX_BEAM_SIZE}, got {self.beam_size!r}")
        if self.long_form not in LONG_FORMS:
            raise ValueError(f"long_form must be one of {LONG_FORMS}, got {self.long_form!r}")
        for name in ("vad", "with_timestamps", "word_timestamps"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean, got {getattr(self, name)!r}")

    @property
    def temperatures(self) -> tuple[float, ...]:
        if isinstance(self.temperature, tuple):
            return tuple(float(t) for t in self.temperature)
        steps = max(0, int(round((1.0 - self.temperature) / FALLBACK_STEP)))
        return tuple(round(self.temperature + FALLBACK_STEP * i, 6) for i in range(steps + 1))

    def beam_size_at(self, temperature: float) -> int:
        """Beams decode at temperature 0 only; a fallback above it samples one hypothesis."""
        return self.beam_size if temperature == 0 else 1
