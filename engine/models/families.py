"""The model families the embed mode serves, by config.json's model_type.

Each family says how to read its architecture from config.json, which checkpoint
tensors it keeps and under what names, how they are combined (fused Q/K/V), and how to
build the model. Every family's model maps a PackedBatch to hidden states
[num_tokens, hidden_size], so the embedder batches, pools and normalises them alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from engine.generate.model_config import SUPPORTED_MODEL_TYPES as DECODER_MODEL_TYPES
from engine.generate.model_config import decoder_config_from_hf
from engine.models import bert, llama, modernbert

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class EmbedFamily:
    name: str
    config_from_hf: Callable[[dict], Any]           # config.json -> the family's frozen config
    checkpoint_name_to_ours: Callable[[str], str | None]   # None: a tensor the model does not use
    combine: Callable[[State, Any], State]           # renamed (maybe FP8) state -> the model's
    build: Callable[[Any], nn.Module]                # the model for a config (called on the meta device)
    max_positions: Callable[[Any], int]              # longest text the model attends over correctly
    default_pooling: str                             # without a sentence-transformers Pooling config


BERT = EmbedFamily("bert", bert.bert_config_from_hf, bert.checkpoint_name_to_ours,
                   lambda state, config: bert.fuse_qkv(state), bert.BertModel,
                   lambda config: config.max_positions, "mean")
MODERNBERT = EmbedFamily("modernbert", modernbert.modernbert_config_from_hf, modernbert.checkpoint_name_to_ours,
                         lambda state, config: state, modernbert.ModernBertModel,
                         lambda config: config.max_positions, "mean")
# LLM-based embedders (Qwen3-Embedding, ...) pool the last token: under causal attention
# it is the only one that has seen the whole text.
DECODER = EmbedFamily("decoder", lambda hf: decoder_config_from_hf(hf, hf.get("eos_token_id")),
                      llama.embedding_checkpoint_name_to_ours, llama.pack_hf_weights, llama.LlamaForEmbedding,
                      lambda config: config.max_model_len, "lasttoken")

MODEL_TYPES: dict[str, EmbedFamily] = {
    **{model_type: BERT for model_type in bert.MODEL_TYPES},
    "modernbert": MODERNBERT,
    **{model_type: DECODER for model_type in DECODER_MODEL_TYPES},
}


def family_of(hf: dict) -> EmbedFamily:
    """The family serving a config.json; ValueError naming an unsupported architecture."""
    model_type = hf.get("model_type", "")
    if model_type not in MODEL_TYPES:
        architectures = ", ".join(hf.get("architectures") or []) or "unknown"
        raise ValueError(f"unsupported architecture for mode 'embed': model_type {model_type!r} ({architectures}); "
                         f"supported model types: {', '.join(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]
