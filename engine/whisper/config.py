"""WhisperConfig: the shapes of a Whisper checkpoint and the decoding lists shipped beside it."""

from __future__ import annotations

from dataclasses import dataclass, field

N_SAMPLES_PER_CHUNK = 480_000      # 30 s at 16 kHz: the encoder's fixed window
SAMPLE_RATE = 16_000
HOP_LENGTH = 160                   # mel frames every 10 ms
SECONDS_PER_TIMESTAMP = 0.02       # one <|t.tt|> step: two mel frames after the stride-2 conv


@dataclass(frozen=True)
class WhisperConfig:
    """Dimensions (openai-whisper's ModelDimensions names) and the token lists that
    depend on the checkpoint rather than on the tokenizer."""

    n_mels: int                    # 80, or 128 for large-v3 and turbo
    n_audio_ctx: int               # 1500 encoder positions
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int                   # 51864 (.en), 51865 (multilingual), 51866 (large-v3)
    n_text_ctx: int                # 448 decoder positions
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    suppress_ids: tuple[int, ...] = ()         # never sampled (non-speech symbols, specials)
    suppress_ids_begin: tuple[int, ...] = ()   # not sampled as the first token (" ", eot)
    alignment_heads: tuple[tuple[int, int], ...] = field(default=())   # (layer, head), for later word timing

    def __post_init__(self) -> None:
        for name in ("n_audio_state", "n_text_state"):
            heads = getattr(self, name.replace("state", "head"))
            if getattr(self, name) % heads:
                raise ValueError(f"{name} {getattr(self, name)} is not divisible by {heads} heads")
        if self.n_mels not in (80, 128):
            raise ValueError(f"n_mels {self.n_mels} is not 80 or 128")

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865
