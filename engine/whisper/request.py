"""DecodeRequest: one audio chunk being decoded, from admission to its last token."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class DecodeOptions:
    """How one chunk is decoded (openai-whisper's DecodingOptions defaults)."""

    task: str = "transcribe"              # "transcribe" | "translate"
    temperature: float = 0.0              # 0: greedy
    with_timestamps: bool = True
    max_new_tokens: int = 224             # openai-whisper's sample_len: n_text_ctx // 2
    max_initial_timestamp_s: float = 1.0
    seed: int = 0                         # sampling at temperature > 0 draws from this
    beam_size: int = 1                    # > 1: beam search (engine.whisper.beam), at temperature 0 only

    def __post_init__(self) -> None:
        if self.beam_size > 1 and self.temperature > 0:
            raise ValueError(f"beam_size {self.beam_size} decodes at temperature 0 only (openai-whisper samples "
                             f"above it), got temperature {self.temperature}")


class Beam(Protocol):
    """The beam a hypothesis row belongs to, as its requests and the decoder use it. It is
    engine.whisper.beam.BeamSearch, which builds on DecodeRequest: declared here so that
    this module does not import it back."""

    rows: list[DecodeRequest]   # the live hypotheses; rows[0] is the chunk's own request

    @property
    def leader(self) -> DecodeRequest:
        """rows[0]: the chunk's own request."""

    def follow_leader(self) -> None:
        """While tokens are forced: give every row the leader's fed tokens, forced tokens and language."""


@dataclass(eq=False)
class DecodeRequest:
    """A chunk's decoding state. The decoder feeds exactly one token per step: while
    `pending` holds forced tokens (the start-of-transcript sequence) it feeds the next of
    them; after that it feeds the token it sampled last."""

    request_id: int
    audio: Callable[[], np.ndarray] | None   # the chunk's 16 kHz samples (<= 30 s), read at admission
    options: DecodeOptions
    language: str | None                 # None: taken from language_from, else detected after <|startoftranscript|>
    language_from: "DecodeRequest | None" = None   # a file's first chunk, whose detected language this one shares
    audio_features: torch.Tensor | None = None   # [n_audio_ctx, n_audio_state], kept for a fallback re-run
    prompt: list[int] = field(default_factory=list)   # earlier text, fed after <|startofprev|> (long_form="sequential")
    pending: deque = field(default_factory=deque)   # forced tokens still to feed
    fed: list[int] = field(default_factory=list)    # tokens fed so far (prompt and sampled)
    output: list[int] = field(default_factory=list)  # sampled tokens, eot excluded
    sum_logprob: float = 0.0
    no_speech_prob: float = 0.0
    language_probs: dict[str, float] | None = None
    is_finished: bool = False
    generator: torch.Generator | None = None
    beam: Beam | None = None             # beam_size > 1: the hypotheses, this request one of them
    error: str | None = None             # set when it finished without a transcript (engine.oom.OOM_ROW_ERROR)

    def restart(self) -> None:
        """Back to before admission, keeping its encoder output (a step ran out of memory):
        it decodes again from its first forced token, to the same tokens. A language it
        detected itself is detected again, so its probabilities come back with it."""
        if self.language_probs is not None:
            self.language, self.language_probs = None, None
        self.pending.clear()
        self.fed.clear()
        self.output.clear()
        self.sum_logprob, self.no_speech_prob = 0.0, 0.0
        self.is_finished, self.generator, self.beam = False, None, None

    @property
    def rows(self) -> list["DecodeRequest"]:
        """The decoder slots this chunk holds: its hypotheses, or itself."""
        return self.beam.rows if self.beam is not None else [self]

    @property
    def is_leader(self) -> bool:
        """Whether this row is the chunk's own request (not a sibling hypothesis of a beam)."""
        return self.beam is None or self.beam.leader is self

    @property
    def position(self) -> int:
        """Where the next fed token goes in the decoder's context."""
        return len(self.fed)

    @property
    def is_ready(self) -> bool:
        """Whether it can start: its language is known, or it will detect one itself."""
        return self.language is not None or self.language_from is None or self.language_from.language is not None

    @property
    def next_token(self) -> int:
        return self.pending[0] if self.pending else self.output[-1]

    @property
    def avg_logprob(self) -> float:
        # openai-whisper divides by the sampled tokens plus the end token.
        return self.sum_logprob / (len(self.output) + 1)
