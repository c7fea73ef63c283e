"""An adapter's tensors by name and shape, checked against a base model's config.json without
torch and without reading the weights: what a submit can know (jobs.adapters). The engine's
load (adapter.py) checks the tensors themselves by the same rules when a request names it.

    adapter_model.safetensors   [8 bytes: header length, little-endian][JSON header][tensor data]
    header                      {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
                                  {"dtype": "F32", "shape": [8, 576], "data_offsets": [0, 18432]}, ...}

Torch-free: the client and `barge submit` import it.
"""

from __future__ import annotations

import json
import re
import struct
from typing import BinaryIO

from engine.lora.adapter_config import PROJECTIONS, WEIGHTS_NAME, AdapterError

MAX_HEADER_BYTES = 100_000_000      # safetensors' own limit on a header
TENSOR_NAME = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])"
                         r"(?:\.\w+)?\.weight")
BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
         "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def read_tensor_shapes(file: BinaryIO, source: str) -> dict[str, tuple[int, ...]]:
    """tensor name -> shape, from an open adapter_model.safetensors' header (its first bytes only)."""
    prefix = file.read(8)
    if len(prefix) < 8:
        raise AdapterError(f"adapter {source}: {WEIGHTS_NAME} is not a safetensors file (shorter than its header)")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES:
        raise AdapterError(f"adapter {source}: {WEIGHTS_NAME} is not a safetensors file (a header of {length} bytes)")
    try:
        header = json.loads(file.read(length))
        return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise AdapterError(f"adapter {source}: {WEIGHTS_NAME} is not a safetensors file ({error})") from None


def base_projection_shapes(hf_config: dict) -> tuple[int, dict[str, tuple[int, int]]]:
    """A Llama-family config.json -> (its layers, projection -> (in_features, out_features)), as
    engine.lora.adapter.projection_shapes computes them from the loaded DecoderConfig."""
    hidden, inter = hf_config["hidden_size"], hf_config["intermediate_size"]
    num_heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hidden // num_heads
    q_size, kv_size = num_heads * head_dim, (hf_config.get("num_key_value_heads") or num_heads) * head_dim
    return hf_config["num_hidden_layers"], {
        "q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
        "o_proj": (q_size, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
        "down_proj": (inter, hidden)}


def check_tensor_shapes(shapes: dict[str, tuple[int, ...]], rank: int, hf_config: dict, source: str) -> None:
    """AdapterError naming the first tensor that would not serve on this base: a name that is
    not a LoRA weight of a projection, a layer past the base's, half a pair, a wrong shape."""
    num_layers, projection_shapes = base_projection_shapes(hf_config)
    halves: dict[tuple[int, str], dict[str, tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        match = TENSOR_NAME.fullmatch(name)
        if match is None or BLOCK.get(match[3]) != match[2]:
            raise AdapterError(f"adapter {source}: tensor {name} is not a LoRA weight of "
                               f"{', '.join(PROJECTIONS)} (embeddings, heads and biases are not served)")
        layer = int(match[1])
        if layer >= num_layers:
            raise AdapterError(f"adapter {source}: tensor {name} is for layer {layer}; the base model has "
                               f"{num_layers} layers")
        halves.setdefault((layer, match[3]), {})[match[4]] = shape
    if not halves:
        raise AdapterError(f"adapter {source}: {WEIGHTS_NAME} holds no LoRA weights")
    for (layer, projection), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"adapter {source}: layers.{layer}.{projection} has no "
                               f"{'lora_B' if 'A' in pair else 'lora_A'}")
        in_features, out_features = projection_shapes[projection]
        for half, expected in (("A", (rank, in_features)), ("B", (out_features, rank))):
            if pair[half] != expected:
                raise AdapterError(f"adapter {source}: layers.{layer}.{projection}.lora_{half} has shape "
                                   f"{list(pair[half])}; r={rank} on this base model needs {list(expected)}")
