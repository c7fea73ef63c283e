"""model_settings: what a loaded model runs on — dtype, device, quantization — read from
the model itself, so a pre-quantized checkpoint reports FP8 whatever was asked for.
Each mode engine adds its own limits to these (Engine.settings; encoder_settings for the
encoders). default_dtype: what a
model loads in when the caller names no dtype."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from engine.layers.fp8_linear import Fp8Linear
from engine.quant.fp8 import FP8_DTYPE


def model_settings(model: nn.Module) -> dict:
    """{"dtype", "device", "quantization"} and, on a GPU, "device_name"."""
    parameter = next(p for p in model.parameters() if p.is_floating_point() and p.dtype != FP8_DTYPE)
    device = parameter.device
    settings = {"dtype": str(parameter.dtype).removeprefix("torch."), "device": device.type,
                "quantization": quantization_of(model)}
    if device.type == "cuda":
        settings["device_name"] = torch.cuda.get_device_name(device)
    return settings


def encoder_settings(model: nn.Module, max_batch_tokens: int, max_seq_length: int, num_ooms: int) -> dict:
    """An encoder engine's (embed, classify): the model's settings and its batch limits;
    `num_oom_retries` once an out-of-memory has lowered `max_batch_tokens` (engine.oom)."""
    settings = {**model_settings(model), "max_batch_tokens": max_batch_tokens, "max_seq_length": max_seq_length}
    if num_ooms:
        settings["num_oom_retries"] = num_ooms
    return settings


def quantization_of(model: nn.Module) -> str | None:
    """None, "fp8" (one scale per output channel), "fp8-block" (128x128 blocks) or
    "fp8-group" (1x128), as the layers were loaded. A layer loaded without its scheme named
    reads from its scales: no wider than one block, it has one scale per row and reads as "fp8"."""
    layers = [module for module in model.modules() if isinstance(module, Fp8Linear)]
    if not layers:
        return None
    schemes = {layer.scheme or ("fp8" if layer.is_per_channel else "fp8-block") for layer in layers}
    return schemes.pop() if len(schemes) == 1 else "fp8-block"


def default_dtype(path: str | Path, device: torch.device) -> str:
    """float32 on CPU. On a GPU the checkpoint's own 16-bit type (config.json's
    torch_dtype, or dtype as transformers 5 writes it), as vLLM's dtype="auto"; a float32
    (or unnamed) checkpoint is served in bfloat16 where the GPU has it, else float16.
    fp32 on a GPU only when asked for."""
    if device.type != "cuda":
        return "float32"
    declared = checkpoint_dtype(path)
    if declared in ("bfloat16", "float16"):
        return declared
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def checkpoint_dtype(path: str | Path) -> str | None:
    """The dtype a model folder's config.json declares; None for a file (GGUF) or none named."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    with open(config, encoding="utf-8") as f:
        hf = json.load(f)
    declared = hf.get("torch_dtype") or hf.get("dtype") or (hf.get("text_config") or {}).get("torch_dtype")
    return str(declared).removeprefix("torch.") if declared else None
