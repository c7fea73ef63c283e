"""model_settings: what a loaded model runs on — dtype, device, quantization — read from
the model itself, so a pre-quantized checkpoint reports FP8 whatever was asked for.
Each mode engine adds its own limits to these (Engine.settings)."""

from __future__ import annotations

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


def quantization_of(model: nn.Module) -> str | None:
    """None, "fp8" (one scale per output channel) or "fp8-block" (128x128 blocks). A layer
    no wider than one block has one scale per row either way and reads as "fp8"."""
    layers = [module for module in model.modules() if isinstance(module, Fp8Linear)]
    if not layers:
        return None
    return "fp8" if all(layer.is_per_channel for layer in layers) else "fp8-block"
