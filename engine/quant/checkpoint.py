"""FP8 checkpoints on disk: read the Hugging Face fp8 and compressed-tensors layouts into
Barge's in-memory form, and write them (`barge quantize SRC DST`).

    on disk                                            in memory (row form, fp8.py)
    HF fp8, blocks:  X.weight_scale_inv [ceil(out/bn), ceil(in/bk)]   X.weight_scale [out, ceil(in/bk)]
    HF fp8, tensor:  X.weight_scale     []  (X.input_scale dropped)   X.weight_scale [out, 1]
    CT channel:      X.weight_scale     [out, 1]                      X.weight_scale [out, 1]
    CT tensor:       X.weight_scale     [] or [1]                     X.weight_scale [out, 1]
    CT block:        X.weight_scale     [ceil(out/bn), ceil(in/bk)]   X.weight_scale [out, ceil(in/bk)]

Activations are always quantized dynamically per token at run time, so static
`input_scale`s are dropped: dynamic scales are at least as accurate.
"""

from __future__ import annotations

import torch

from engine.quant.config import Fp8Config, fp8_config_from_name
from engine.quant.fp8 import FP8_DTYPE, block_scales_to_rows, rows_to_block_scales
from engine.quant.state import SCALE_SUFFIX, IsTarget, is_block_linear_weight, quantize_state_dict

DROPPED_SUFFIXES = (".input_scale", ".input_zero_point", ".weight_zero_point", ".k_scale", ".v_scale")


def from_checkpoint(state: dict[str, torch.Tensor], config: Fp8Config) -> dict[str, torch.Tensor]:
    """Tensors as a pre-quantized checkpoint stores them -> Barge's in-memory form."""
    converted = {}
    for name, tensor in state.items():
        if name.endswith(DROPPED_SUFFIXES):
            continue
        if name.endswith((".weight_scale_inv", ".weight_scale")):
            weight_name = name.rsplit(".", 1)[0] + ".weight"
            if weight_name not in state or state[weight_name].dtype != FP8_DTYPE:
                raise ValueError(f"checkpoint scale {name!r} has no float8_e4m3fn weight {weight_name!r} beside it")
            num_rows = state[weight_name].shape[0]
            converted[weight_name.removesuffix("weight") + SCALE_SUFFIX] = _scale_to_rows(name, tensor, num_rows, config)
        else:
            converted[name] = tensor
    _check_every_fp8_weight_has_a_scale(converted)
    return converted


def _scale_to_rows(name: str, scale: torch.Tensor, num_rows: int, config: Fp8Config) -> torch.Tensor:
    scale = scale.float()
    if scale.numel() == 1:                          # per-tensor: the same scale on every row
        return scale.reshape(1, 1).expand(num_rows, 1).contiguous()
    if config.block_size is not None:
        return block_scales_to_rows(scale, num_rows, config.block_size[0])
    if scale.shape not in ((num_rows, 1), (num_rows,)):
        raise ValueError(f"per-channel scale {name!r} has shape {tuple(scale.shape)}, expected ({num_rows}, 1)")
    return scale.reshape(num_rows, 1).contiguous()


def _check_every_fp8_weight_has_a_scale(state: dict[str, torch.Tensor]) -> None:
    for name, tensor in state.items():
        if tensor.dtype == FP8_DTYPE and name.removesuffix("weight") + SCALE_SUFFIX not in state:
            raise ValueError(f"checkpoint tensor {name!r} is float8 but has no scale")


def to_checkpoint(state: dict[str, torch.Tensor], config: Fp8Config) -> dict[str, torch.Tensor]:
    """Barge's in-memory form -> what hf_quantization_config(config) promises on disk."""
    written = {}
    for name, tensor in state.items():
        if not name.endswith("." + SCALE_SUFFIX):
            written[name] = tensor
        elif config.block_size is None:            # compressed-tensors per-channel: [out, 1] as is
            written[name] = tensor.contiguous()
        else:                                       # HF fp8: one scale per block, "_inv" = dequantizing multiplier
            written[name + "_inv"] = rows_to_block_scales(tensor, config.block_size[0])
    return written


def load_fp8_state(state: dict[str, torch.Tensor], checkpoint_config: Fp8Config | None,
                   quantization: str | None, is_target: IsTarget = is_block_linear_weight,
                   ) -> tuple[dict[str, torch.Tensor], Fp8Config | None]:
    """The state a model loads and the scheme it runs: a pre-quantized checkpoint keeps its own
    scheme whatever fp8 variant was asked for (re-quantizing FP8 would only lose accuracy);
    otherwise quantization= decides, quantizing the target weights now."""
    requested = fp8_config_from_name(quantization)
    if checkpoint_config is not None:
        return from_checkpoint(state, checkpoint_config), checkpoint_config
    if requested is None:
        return state, None
    return quantize_state_dict(state, requested, is_target), requested
