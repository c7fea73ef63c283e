"""Whisper checkpoints in three layouts → one state dict in openai-whisper's names.

    CTranslate2 folder   model.bin + config.json     (faster-whisper; fused QKV, fp16)
    Hugging Face folder  config.json (model_type whisper) + model.safetensors
    openai-whisper file  a `.pt` checkpoint: {"dims": ..., "model_state_dict": ...}

openai-whisper's names are the model's own (engine.whisper.model), so the `.pt` path is
a plain load and the parity tests can hand the converted tensors to the reference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.whisper.config import WhisperConfig
from engine.whisper.ct2 import read_ct2


@dataclass(frozen=True)
class Checkpoint:
    config: WhisperConfig
    state_dict: dict[str, torch.Tensor]   # openai-whisper names; the checkpoint's own dtype
    folder: Path                          # where tokenizer.json would be


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    if path.is_file() and path.suffix == ".pt":
        return _load_openai(path)
    if not path.is_dir():
        raise FileNotFoundError(f"Whisper model not found: {path} (expected a folder or a .pt file)")
    if (path / "model.bin").is_file():
        return _load_ct2(path)
    hf = _read_json(path / "config.json")
    if hf.get("model_type") == "whisper":
        return _load_hf(path, hf)
    raise ValueError(f"{path} holds no Whisper model: no CTranslate2 model.bin and config.json's "
                     f"model_type is {hf.get('model_type')!r}, not 'whisper'")


def is_whisper_model(path: str | Path) -> bool:
    """Cheap test (no weights read) that `path` is a Whisper model in a layout we load."""
    path = Path(path)
    if path.suffix == ".pt":
        return path.is_file()
    config = _read_json(path / "config.json") if path.is_dir() else {}
    return config.get("model_type") == "whisper" or ((path / "model.bin").is_file() and "lang_ids" in config)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


# --- CTranslate2 -------------------------------------------------------------------------

def _load_ct2(folder: Path) -> Checkpoint:
    spec_name, variables = read_ct2(folder / "model.bin")
    if spec_name != "WhisperSpec":
        raise ValueError(f"{folder / 'model.bin'} is a CTranslate2 {spec_name}, not a WhisperSpec")
    state = {}
    for name, array in variables.items():
        if array.ndim == 0:       # flags and head counts, not weights
            continue
        for new_name, part in _ct2_rename(name, array):
            state[new_name] = torch.from_numpy(np.array(part))
    extra = _read_json(folder / "config.json")
    heads = (int(variables["encoder/num_heads"]), int(variables["decoder/num_heads"]))
    return Checkpoint(_config_from_state(state, heads, extra), state, folder)


_CT2_LAYER = re.compile(r"(encoder|decoder)/layer_(\d+)/(self_attention|attention|ffn)/(\w+)/(\w+)")
_CT2_ATTN = {"self_attention": "attn", "attention": "cross_attn"}
_NORM = {"gamma": "weight", "beta": "bias"}
_CT2_TOP = {
    "encoder/conv1": "encoder.conv1", "encoder/conv2": "encoder.conv2", "encoder/layer_norm": "encoder.ln_post",
    "decoder/embeddings": "decoder.token_embedding", "decoder/layer_norm": "decoder.ln",
}


def _ct2_rename(name: str, array: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """One CTranslate2 variable → (openai name, tensor) pairs; fused projections split."""
    if name.endswith("position_encodings/encodings"):
        return [(name.split("/")[0] + ".positional_embedding", array)]
    if name == "decoder/projection/weight":     # tied to the token embedding
        return []
    match = _CT2_LAYER.fullmatch(name)
    if match is None:
        stem, leaf = name.rsplit("/", 1)
        if stem not in _CT2_TOP:
            raise ValueError(f"unexpected CTranslate2 Whisper variable {name!r}")
        return [(f"{_CT2_TOP[stem]}.{_NORM.get(leaf, leaf)}", array)]
    side, layer, block, sub, leaf = match.groups()
    prefix = f"{side}.blocks.{layer}"
    if block == "ffn":
        target = {"layer_norm": "mlp_ln", "linear_0": "mlp.0", "linear_1": "mlp.2"}[sub]
        return [(f"{prefix}.{target}.{_NORM.get(leaf, leaf)}", array)]
    attn = _CT2_ATTN[block]
    if sub == "layer_norm":
        return [(f"{prefix}.{attn}_ln.{_NORM[leaf]}", array)]
    projections = {("attn", "linear_0"): ("query", "key", "value"), ("attn", "linear_1"): ("out",),
                   ("cross_attn", "linear_0"): ("query",), ("cross_attn", "linear_1"): ("key", "value"),
                   ("cross_attn", "linear_2"): ("out",)}[(attn, sub)]
    parts = np.split(array, len(projections), axis=0)
    # Whisper's key projection has no bias; CTranslate2 stores zeros there to fuse.
    return [(f"{prefix}.{attn}.{proj}.{leaf}", part) for proj, part in zip(projections, parts)
            if not (proj == "key" and leaf == "bias")]


# --- Hugging Face ------------------------------------------------------------------------

_HF_RENAMES = (
    (r"^model\.encoder\.embed_positions\.weight$", "encoder.positional_embedding"),
    (r"^model\.decoder\.embed_positions\.weight$", "decoder.positional_embedding"),
    (r"^model\.decoder\.embed_tokens\.", "decoder.token_embedding."),
    (r"^model\.encoder\.layer_norm\.", "encoder.ln_post."),
    (r"^model\.decoder\.layer_norm\.", "decoder.ln."),
    (r"^model\.(encoder|decoder)\.layers\.", r"\1.blocks."),
    (r"^model\.encoder\.conv", "encoder.conv"),
    (r"\.self_attn_layer_norm\.", ".attn_ln."), (r"\.encoder_attn_layer_norm\.", ".cross_attn_ln."),
    (r"\.self_attn\.", ".attn."), (r"\.encoder_attn\.", ".cross_attn."),
    (r"\.q_proj\.", ".query."), (r"\.k_proj\.", ".key."), (r"\.v_proj\.", ".value."), (r"\.out_proj\.", ".out."),
    (r"\.fc1\.", ".mlp.0."), (r"\.fc2\.", ".mlp.2."), (r"\.final_layer_norm\.", ".mlp_ln."),
)


def hf_to_openai_name(name: str) -> str:
    for pattern, replacement in _HF_RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def _load_hf(folder: Path, hf: dict) -> Checkpoint:
    from safetensors.torch import load_file
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in Hugging Face Whisper folder {folder}")
    state = {}
    for file in files:
        for name, tensor in load_file(file).items():
            if name != "proj_out.weight":      # tied to the token embedding
                state[hf_to_openai_name(name)] = tensor
    generation = _read_json(folder / "generation_config.json")
    extra = {"suppress_ids": generation.get("suppress_tokens") or [],
             "suppress_ids_begin": generation.get("begin_suppress_tokens") or [],
             "alignment_heads": generation.get("alignment_heads") or []}
    heads = (hf["encoder_attention_heads"], hf["decoder_attention_heads"])
    return Checkpoint(_config_from_state(state, heads, extra), state, folder)


# --- openai-whisper .pt ------------------------------------------------------------------

def _load_openai(path: Path) -> Checkpoint:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    dims = checkpoint["dims"]
    state = dict(checkpoint["model_state_dict"])
    state.pop("alignment_heads", None)     # a sparse buffer openai-whisper sets after load
    return Checkpoint(WhisperConfig(**dims), state, path.parent)


def _config_from_state(state: dict[str, torch.Tensor], heads: tuple[int, int], extra: dict) -> WhisperConfig:
    n_layers = {side: 1 + max(int(k.split(".")[2]) for k in state if k.startswith(f"{side}.blocks."))
                for side in ("encoder", "decoder")}
    audio_ctx, audio_state = state["encoder.positional_embedding"].shape
    vocab, text_state = state["decoder.token_embedding.weight"].shape
    return WhisperConfig(
        n_mels=state["encoder.conv1.weight"].shape[1], n_audio_ctx=audio_ctx, n_audio_state=audio_state,
        n_audio_head=heads[0], n_audio_layer=n_layers["encoder"], n_vocab=vocab,
        n_text_ctx=state["decoder.positional_embedding"].shape[0], n_text_state=text_state,
        n_text_head=heads[1], n_text_layer=n_layers["decoder"],
        suppress_ids=tuple(extra.get("suppress_ids") or ()),
        suppress_ids_begin=tuple(extra.get("suppress_ids_begin") or ()),
        alignment_heads=tuple(tuple(pair) for pair in extra.get("alignment_heads") or ()))
