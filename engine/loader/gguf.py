"""Read a GGUF file (llama.cpp's format): metadata, a DecoderConfig, and dequantized weights
under Hugging Face names, so the rest of the engine cannot tell it from a safetensors folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.generate.model_config import DecoderConfig
from engine.loader.gguf_reader import read_gguf_file

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}
SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass
class GGUFCheckpoint:
    metadata: dict                          # key -> value (str, number, list), tensors excluded
    config: DecoderConfig
    state: dict[str, torch.Tensor]          # Hugging Face names, float32


def read_gguf(path: str | Path) -> GGUFCheckpoint:
    import gguf                             # optional dependency: only GGUF files need it (dequantizing)

    file = read_gguf_file(path)             # metadata parsed here: gguf.GGUFReader's takes 40x longer
    metadata = file.metadata
    tensor_names = {tensor.name for tensor in file.tensors}
    config = gguf_decoder_config(metadata, tie_word_embeddings="output.weight" not in tensor_names)
    state = {}
    for tensor in file.tensors:
        # A copy: unquantized tensors come back as read-only views of the memory-mapped file.
        quant_type = gguf.GGMLQuantizationType(tensor.tensor_type)
        weights = torch.from_numpy(np.array(gguf.quants.dequantize(tensor.data, quant_type), copy=True))
        name, weights = _to_hf(tensor.name, weights.float(), config)
        state[name] = weights
    return GGUFCheckpoint(metadata, config, state)


def gguf_decoder_config(metadata: dict, tie_word_embeddings: bool) -> DecoderConfig:
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {SUPPORTED_ARCHITECTURES}")

    def get(key: str, default=None):
        return metadata.get(f"{arch}.{key}", default)

    num_heads = get("attention.head_count")
    hidden_size = get("embedding_length")
    scaling = {}
    if get("rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    return DecoderConfig(
        model_type="llama", vocab_size=get("vocab_size") or len(metadata["tokenizer.ggml.tokens"]),
        hidden_size=hidden_size, intermediate_size=get("feed_forward_length"), num_layers=get("block_count"),
        num_heads=num_heads, num_kv_heads=get("attention.head_count_kv") or num_heads,
        head_dim=get("rope.dimension_count") or hidden_size // num_heads,
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5), rope_theta=get("rope.freq_base", 10000.0),
        max_position_embeddings=get("context_length", 2048), tie_word_embeddings=tie_word_embeddings,
        qkv_bias=False, qk_norm=False, rope_scaling=scaling, eos_token_ids=() if eos is None else (eos,),
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
    )


def _to_hf(name: str, weights: torch.Tensor, config: DecoderConfig) -> tuple[str, torch.Tensor]:
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name], weights
    _, index, kind, suffix = name.split(".", 3)
    if kind not in LAYER_TENSORS:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    if kind == "attn_q":
        weights = unpermute_rows(weights, config.num_heads)
    elif kind == "attn_k":
        weights = unpermute_rows(weights, config.num_kv_heads)
    return f"model.layers.{index}.{LAYER_TENSORS[kind]}.{suffix}", weights


def unpermute_rows(weights: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves each head's rows for its rotary layout; Hugging Face's
    rotate-half rotary wants the two halves of every head apart again."""
    rows, cols = weights.shape
    return weights.reshape(num_heads, rows // num_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
