"""LoraLinear: a base linear (nn.Linear, PackedLinear, Fp8Linear) plus the step's adapters.

Swapped in once, at load (gpt-fast's way of adding a feature without touching the model's
hot path): the decoder calls `layer(x, lora)` only when the step has LoRA tokens
(engine/models/llama.py), so a base-only step runs the base linear and nothing else.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.generate.model_config import DecoderConfig
from engine.lora.batch import LoraBatch
from engine.lora.weights import KernelLoraWeights, Projection, TorchLoraWeights

LoraWeights = TorchLoraWeights | KernelLoraWeights


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Module, weights: LoraWeights):
        super().__init__()
        self.base = base
        self.lora_weights = weights

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        y = self.base(x)
        if lora is not None:
            self.lora_weights.add_to(y, x, lora)
        return y


def linear_projections(config: DecoderConfig) -> dict[str, list[Projection]]:
    """The decoder layer's linears (attribute paths) -> the PEFT projections in their output columns."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "self_attn.qkv_proj": [Projection("q_proj", 0, q_size, hidden),
                               Projection("k_proj", q_size, q_size + kv_size, hidden),
                               Projection("v_proj", q_size + kv_size, q_size + 2 * kv_size, hidden)],
        "self_attn.o_proj": [Projection("o_proj", 0, hidden, q_size)],
        "mlp.gate_up_proj": [Projection("gate_proj", 0, inter, hidden),
                             Projection("up_proj", inter, 2 * inter, hidden)],
        "mlp.down_proj": [Projection("down_proj", 0, hidden, inter)],
    }


def wrap_linears(layers: nn.ModuleList, config: DecoderConfig, make_weights) -> list[list[LoraWeights]]:
    """Replace each layer's four linears with LoraLinears; make_weights(projections) builds each one's
    slot weights. Returns them per layer, in the order of linear_projections."""
    per_layer = []
    for layer in layers:
        weights = []
        for path, projections in linear_projections(config).items():
            block_name, linear_name = path.split(".")
            block = getattr(layer, block_name)
            weights.append(make_weights(projections))
            setattr(block, linear_name, LoraLinear(getattr(block, linear_name), weights[-1]))
        per_layer.append(weights)
    return per_layer
