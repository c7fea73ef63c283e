"""load_decoder: a model folder (config.json + safetensors + tokenizer.json) or a GGUF file,
to a ready LlamaForCausalLM, its DecoderConfig and its TextTokenizer."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from engine.generate.model_config import DecoderConfig, load_decoder_config
from engine.generate.tokenizer import TextTokenizer
from engine.loader.gguf import read_gguf
from engine.loader.safetensors import weight_files
from engine.models.llama import LlamaForCausalLM, pack_hf_weights


def load_decoder(path: str | Path, dtype: torch.dtype,
                 device: torch.device) -> tuple[LlamaForCausalLM, DecoderConfig, TextTokenizer]:
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        checkpoint = read_gguf(path)
        config, state = checkpoint.config, checkpoint.state
        tokenizer = TextTokenizer.from_gguf_metadata(checkpoint.metadata)
    elif path.is_dir():
        config = load_decoder_config(path)
        files = weight_files(path)        # a missing weights file fails before the tokenizer is read
        tokenizer = TextTokenizer.from_folder(path)
        state = _read_safetensors(files)
    else:
        raise FileNotFoundError(f"model not found: {path} (expected a model folder or a .gguf file)")
    return build_model(config, state, dtype, device), config, tokenizer


def build_model(config: DecoderConfig, state: dict[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device) -> LlamaForCausalLM:
    """Built on the meta device, then the checkpoint's tensors are assigned, never copied twice."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    try:
        missing, unexpected = model.load_state_dict(pack_hf_weights(state, config), strict=False, assign=True)
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
