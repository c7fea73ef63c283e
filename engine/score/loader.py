"""load_classifier: a *ForSequenceClassification folder -> its configs, tokenizer and a
ready classifier (engine/score/heads.py), built on the meta device and assigned the
checkpoint's tensors, as the embedder loads its encoders."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.embed.config import EncoderConfig, load_encoder_config
from engine.embed.embedder import check_cpu_dtype
from engine.layers import linear
from engine.layers.fp8_linear import use_fp8_linears
from engine.layers.packed_linear import pack_linears
from engine.loader.meta import on_meta
from engine.loader.safetensors import assign_weights, read_weights, weight_files
from engine.models.families import MODEL_TYPES
from engine.quant.checkpoint import load_fp8_state
from engine.quant.config import fp8_config_of_folder
from engine.score.head_config import HeadConfig, head_config_from_hf, read_config
from engine.score.heads import CLASSIFIERS, head_name_to_ours
from engine.score.tokenizer import ScoreTokenizer


def load_classifier(folder: str | Path, dtype: torch.dtype, device: torch.device, max_batch_tokens: int,
                    quantization: str | None = None,
                    ) -> tuple[EncoderConfig, HeadConfig, ScoreTokenizer, torch.nn.Module]:
    """quantization: None or "fp8" / "fp8-block" for the encoder's linear layers (the head
    stays in `dtype`); ValueError naming what the folder holds that Barge does not run."""
    check_cpu_dtype(dtype, device)
    head = head_config_from_hf(read_config(folder))
    config = load_encoder_config(folder)
    family = MODEL_TYPES[config.model_type]
    weight_files(folder)              # a missing weights file fails before anything is built
    tokenizer = ScoreTokenizer.from_folder(folder, config.max_seq_length)

    def encoder_name(name: str) -> str | None:
        return None if head_name_to_ours(family.name, name) else family.checkpoint_name_to_ours(name)

    state, fp8 = load_fp8_state(read_weights(folder, encoder_name), fp8_config_of_folder(folder), quantization)
    state = family.combine(state, config.architecture)
    with on_meta():
        model = CLASSIFIERS[family.name](config.architecture, head)
    use_fp8_linears(model.encoder, state, fp8.block_cols if fp8 else None, fp8.name if fp8 else None)
    state = {f"encoder.{name}": tensor for name, tensor in state.items()}
    state.update(read_weights(folder, lambda name: head_name_to_ours(family.name, name)))
    assign_weights(model, state, folder)
    model = model.to(device=device, dtype=dtype).eval()
    if linear.ONEDNN_PAYS or dtype == torch.bfloat16:     # as the embedder packs (engine/embed/embedder.py)
        pack_linears(model, max_batch_tokens, (torch.float32, torch.bfloat16))
    return config, head, tokenizer, model
