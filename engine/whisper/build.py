"""load_transcriber: a Whisper checkpoint on a device, ready to transcribe."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.layers.packed_linear import pack_linears
from engine.whisper.decoding import ChunkDecoder
from engine.whisper.loader import Checkpoint, load_checkpoint
from engine.whisper.logit_rules import LogitRules
from engine.whisper.model import Whisper
from engine.whisper.tokenizer import WhisperTokenizer
from engine.whisper.transcriber import Transcriber

# Chunks decoded together, and chunks encoded in one batch when slots free up. A CPU
# step is bound by reading every running chunk's cross-attention K/V, so more slots
# buy little there; a GPU wants many chunks in flight.
DEFAULT_MAX_SLOTS = {"cpu": 16, "cuda": 64}
DEFAULT_MAX_ADMIT = {"cpu": 4, "cuda": 16}
QUANTIZATIONS = (None,)     # "fp8" arrives with the FP8 work: see _quantize


def load_transcriber(path: str | Path, dtype: torch.dtype, device: torch.device, *,
                     max_slots: int | None = None, max_admit: int | None = None,
                     quantization: str | None = None) -> Transcriber:
    checkpoint = load_checkpoint(path)
    model = Whisper(checkpoint.config)
    model.load_state_dict({name: tensor.to(torch.float32) for name, tensor in checkpoint.state_dict.items()})
    model = _quantize(model.to(device=device, dtype=dtype).eval(), quantization)
    tokenizer = WhisperTokenizer(checkpoint.config, checkpoint.folder)
    rules = LogitRules(tokenizer, *_suppress_lists(checkpoint, tokenizer))
    kind = device.type if device.type in DEFAULT_MAX_SLOTS else "cuda"
    max_slots = max_slots or DEFAULT_MAX_SLOTS[kind]
    pack_linears(model, max_slots)     # CPU fp32: weights reordered once for oneDNN
    decoder = ChunkDecoder(model, tokenizer, rules, max_slots, max_admit or DEFAULT_MAX_ADMIT[kind])
    return Transcriber(decoder)


def _quantize(model: Whisper, quantization: str | None) -> Whisper:
    """The hook for FP8 weights (engine.quant): Whisper stays 16-bit unless a job asks."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not available for transcription yet; "
                         f"expected one of {QUANTIZATIONS}")
    return model


def _suppress_lists(checkpoint: Checkpoint, tokenizer: WhisperTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The checkpoint's own lists (CTranslate2 and Hugging Face ship them); for an openai
    `.pt`, the reference's rule: its non-speech symbols plus the special tokens."""
    config = checkpoint.config
    specials = (tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev, tokenizer.sot_lm,
                tokenizer.no_speech)
    suppress = config.suppress_ids
    if not suppress:
        try:
            from whisper.tokenizer import get_tokenizer
            suppress = get_tokenizer(config.is_multilingual, num_languages=len(tokenizer.language_ids)).non_speech_tokens
        except ImportError:
            suppress = ()
    begin = config.suppress_ids_begin or (220, tokenizer.eot)   # " " and <|endoftext|>
    return tuple(sorted(set(suppress) | set(specials))), tuple(begin)
