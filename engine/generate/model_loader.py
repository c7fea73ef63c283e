"""load_decoder: a model folder (config.json + safetensors + tokenizer.json) or a GGUF file,
to a ready LlamaForCausalLM, its DecoderConfig and its TextTokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from engine.generate.model_config import DecoderConfig, load_decoder_config
from engine.generate.tokenizer import TextTokenizer
from engine.layers.fp8_linear import use_fp8_linears
from engine.loader.gguf import read_gguf
from engine.loader.meta import on_meta
from engine.loader.safetensors import weight_files
from engine.models.llama import LlamaForCausalLM, pack_hf_weights
from engine.quant.checkpoint import load_fp8_state
from engine.quant.config import Fp8Config, fp8_config_of_folder


def load_decoder(path: str | Path, dtype: torch.dtype, device: torch.device, quantization: str | None = None,
                 ) -> tuple[LlamaForCausalLM, DecoderConfig, TextTokenizer]:
    """quantization: None or "fp8" / "fp8-block" (engine/quant/config.py); a folder whose
    config.json declares FP8 loads as FP8 either way."""
    path = Path(path)
    checkpoint_fp8 = None
    if path.is_file() and path.suffix == ".gguf":
        checkpoint = read_gguf(path)
        config, state = checkpoint.config, checkpoint.state
        tokenizer = TextTokenizer.from_gguf_metadata(checkpoint.metadata)
    elif path.is_dir():
        config = load_decoder_config(path)
        checkpoint_fp8 = fp8_config_of_folder(path)
        files = weight_files(path)        # a missing weights file fails before the tokenizer is read
        tokenizer = TextTokenizer.from_folder(path)
        state = _read_safetensors(files)
    else:
        raise FileNotFoundError(f"model not found: {path} (expected a model folder or a .gguf file)")
    state, fp8 = load_fp8_state(state, checkpoint_fp8, quantization)
    return build_model(config, state, dtype, device, fp8), config, tokenizer


def build_model(config: DecoderConfig, state: dict[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device, fp8: Fp8Config | None = None) -> LlamaForCausalLM:
    """Built on the meta device, then the checkpoint's tensors are assigned, never copied twice.
    Linear layers whose weights carry an FP8 scale become Fp8Linear first."""
    with on_meta():
        model = LlamaForCausalLM(config)
    state = pack_hf_weights(state, config)
    use_fp8_linears(model, state, fp8.block_cols if fp8 else None, fp8.name if fp8 else None)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as error:       # shape mismatches
        raise ValueError(f"weights do not fit the model config: {error}") from error
    if config.tie_word_embeddings:
        missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"weights do not match the model: missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}")
    model.tie_weights()
    return model.to(device=device, dtype=dtype).eval()


def _read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    state = {}
    for path in files:
        with safe_open(str(path), framework="pt") as checkpoint:
            for name in checkpoint.keys():
                state[name] = checkpoint.get_tensor(name)
    return state
