"""A tiny random-weight Whisper behind a real ChunkDecoder: the transcribe engine's
scheduling and slots run for real in milliseconds, with no checkpoint. Its text is
noise; a chunk ends at the eighth decoder position at the latest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.whisper.config import WhisperConfig
from engine.whisper.decoding import ChunkDecoder
from engine.whisper.logit_rules import LogitRules
from engine.whisper.model import Whisper
from engine.whisper.request import DecodeOptions, DecodeRequest
from engine.whisper.tokenizer import WhisperTokenizer

# The encoder's window is fixed (1500 positions after the conv stride); the rest is tiny.
TINY_RANDOM = WhisperConfig(n_mels=80, n_audio_ctx=1500, n_audio_state=8, n_audio_head=2, n_audio_layer=1,
                            n_vocab=51865, n_text_ctx=8, n_text_state=8, n_text_head=2, n_text_layer=1)


def random_chunk_decoder(folder: Path, max_slots: int, max_admit: int) -> ChunkDecoder:
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}, "merges": []}}')
    torch.manual_seed(0)
    model = Whisper(TINY_RANDOM).eval()
    tokenizer = WhisperTokenizer(TINY_RANDOM, folder)
    return ChunkDecoder(model, tokenizer, LogitRules(tokenizer, (), ()), max_slots, max_admit)


def silent_chunk(request_id: int) -> DecodeRequest:
    """A one-second chunk in English (so no language detection step)."""
    return DecodeRequest(request_id, lambda: np.zeros(16_000, dtype=np.float32), DecodeOptions(), "en")
