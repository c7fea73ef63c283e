"""load_transcriber: a Whisper checkpoint on a device, ready to transcribe."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from engine.layers.fp8_linear import use_fp8_linears
from engine.layers.packed_linear import pack_linears
from engine.loader.meta import without_init
from engine.quant.checkpoint import load_fp8_state
from engine.whisper.config import WhisperConfig
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
DEFAULT_MAX_ADMIT = {"cpu": 4, "cuda": 16}   # CUDA: raised to what its free memory holds (max_encoder_batch)
ENCODER_MEMORY_SHARE = 0.5      # of the free memory after loading, for one encoder batch
# Whisper is served in 16-bit; FP8 weights only when a job asks (and can check them
# against the 16-bit transcripts: JobSpec.quant_check_rows).
QUANTIZATIONS = (None, "fp8", "fp8-block", "fp8-group")
# A linear weight inside an encoder or decoder block (attention and MLP): the embeddings,
# the convolutions and the layer norms (1-D) stay in 16/32-bit.
WHISPER_BLOCK_TENSOR = re.compile(r"(^|\.)blocks\.\d+\.")


def load_transcriber(path: str | Path, dtype: torch.dtype, device: torch.device, *,
                     max_slots: int | None = None, max_admit: int | None = None,
                     quantization: str | None = None) -> Transcriber:
    checkpoint = load_checkpoint(path)
    with without_init():                # every tensor comes from the checkpoint (a strict load)
        model = Whisper(checkpoint.config)
    model = _load_weights(model, checkpoint.state_dict, quantization)
    model = model.to(device=device, dtype=dtype).eval()
    tokenizer = WhisperTokenizer(checkpoint.config, checkpoint.folder)
    rules = LogitRules(tokenizer, *_suppress_lists(checkpoint, tokenizer))
    kind = device.type if device.type in DEFAULT_MAX_SLOTS else "cuda"
    max_slots = max_slots or DEFAULT_MAX_SLOTS[kind]
    pack_linears(model, max_slots)     # CPU fp32: weights reordered once for oneDNN
    decoder = ChunkDecoder(model, tokenizer, rules, max_slots, max_admit or DEFAULT_MAX_ADMIT[kind])
    if device.type == "cuda" and max_admit is None:
        free_bytes, _ = torch.cuda.mem_get_info(device)      # after the weights and the decoder cache
        decoder.scheduler.max_admit = max_encoder_batch(checkpoint.config, dtype.itemsize, free_bytes, max_slots)
    return Transcriber(decoder)


def max_encoder_batch(config: WhisperConfig, itemsize: int, free_bytes: int, max_slots: int) -> int:
    """Chunks encoded at once on a GPU: as many as ENCODER_MEMORY_SHARE of the free memory
    holds (a chunk's encoder activations, with the attention scores of the math kernel in
    case SDPA falls back to it), up to max_slots, since a chunk needs a slot to be admitted."""
    ctx, state = config.n_audio_ctx, config.n_audio_state
    # mel in fp32; conv outputs at 2 x ctx; residual, norm, q, k, v, out and the 4 x state MLP
    # hidden, twice over for the temporaries beside them; the cross K/V of every layer.
    activations = config.n_mels * 2 * ctx * 4 + (2 * 2 * ctx * state + 2 * 10 * ctx * state) * itemsize
    scores = config.n_audio_head * ctx * ctx * (itemsize + 4)
    cross = 2 * config.n_text_layer * ctx * config.n_text_state * itemsize
    per_chunk = activations + scores + cross
    return max(1, min(max_slots, int(free_bytes * ENCODER_MEMORY_SHARE) // per_chunk))


def _load_weights(model: Whisper, state: dict[str, torch.Tensor], quantization: str | None) -> Whisper:
    """The model holding the checkpoint's tensors; with quantization, the blocks' linear
    layers become Fp8Linear (engine.layers.fp8_linear), quantized from fp32."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unsupported quantization {quantization!r} for transcription; "
                         f"expected one of {QUANTIZATIONS}")
    state = {name: tensor.to(torch.float32) for name, tensor in state.items()}
    state, fp8 = load_fp8_state(state, None, quantization, is_whisper_linear_weight)
    use_fp8_linears(model, state, fp8.block_cols if fp8 else None, fp8.name if fp8 else None)
    model.load_state_dict(state)
    return model


def is_whisper_linear_weight(name: str, tensor: torch.Tensor) -> bool:
    return (name.endswith(".weight") and tensor.dim() == 2 and tensor.is_floating_point()
            and WHISPER_BLOCK_TENSOR.search(name) is not None)


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
