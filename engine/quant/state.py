"""Quantize a state dict's linear weights to FP8, generic over architectures.

Works on checkpoint names (Hugging Face's `model.layers.N.mlp.up_proj.weight`, BERT's
`encoder.layer.N.intermediate.dense.weight`, Whisper's `model.encoder.layers.N.fc1.weight`)
as well as Barge's own, so the same pass serves quantize-at-load, `barge quantize` and
models added later. Each target `X.weight` becomes float8 and gains `X.weight_scale`
(row form, see engine/quant/fp8.py).
"""

from __future__ import annotations

import re
from typing import Callable

import torch

from engine.quant.config import Fp8Config
from engine.quant.fp8 import block_scales_to_rows, quantize_blocks, quantize_per_channel
from engine.quant.recipe import kept_16bit

# A weight inside a numbered transformer block. Embeddings, the LM head and anything
# else outside the blocks stay in 16/32-bit; norms and biases are 1-D and never match.
BLOCK_TENSOR = re.compile(r"(^|\.)layers?\.\d+\.")
SCALE_SUFFIX = "weight_scale"

IsTarget = Callable[[str, torch.Tensor], bool]


def is_block_linear_weight(name: str, tensor: torch.Tensor) -> bool:
    """The default target: a 2-D float `.weight` inside a numbered block (a linear layer's)."""
    return (name.endswith(".weight") and tensor.dim() == 2 and tensor.is_floating_point()
            and BLOCK_TENSOR.search(name) is not None)


def scale_name(weight_name: str) -> str:
    return weight_name.removesuffix("weight") + SCALE_SUFFIX


def quantize_weight(weight: torch.Tensor, config: Fp8Config) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (q float8 [out, in], row-form scale float32 [out, num_groups])."""
    if config.block_size is None:
        return quantize_per_channel(weight, config.scale_method)
    q, block_scale = quantize_blocks(weight, config.block_size, config.scale_method)
    return q, block_scales_to_rows(block_scale, weight.shape[0], config.block_size[0])


def target_names(state: dict[str, torch.Tensor], is_target: IsTarget = is_block_linear_weight) -> list[str]:
    return [name for name, tensor in state.items() if is_target(name, tensor)]


def quantize_state_dict(state: dict[str, torch.Tensor], config: Fp8Config,
                        is_target: IsTarget = is_block_linear_weight,
                        all_targets: list[str] | None = None) -> dict[str, torch.Tensor]:
    """A new state dict: every target weight the recipe does not keep 16-bit as float8 plus
    its scale, the rest untouched. all_targets: the whole model's target names when `state`
    is one shard of it (the recipe's first and last blocks are the model's, not the shard's)."""
    kept = kept_16bit(all_targets if all_targets is not None else target_names(state, is_target), config)
    quantized = {}
    for name, tensor in state.items():
        if is_target(name, tensor) and name not in kept:
            quantized[name], quantized[scale_name(name)] = quantize_weight(tensor, config)
        else:
            quantized[name] = tensor
    return quantized


def quantized_weight_names(state: dict[str, torch.Tensor]) -> list[str]:
    """The `.weight` names that carry an FP8 scale."""
    return [name.removesuffix(SCALE_SUFFIX) + "weight" for name in state if name.endswith("." + SCALE_SUFFIX)]
