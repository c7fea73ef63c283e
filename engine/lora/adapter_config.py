"""AdapterConfig: a PEFT LoRA adapter's adapter_config.json, read and checked.

Torch-free, so that a job's adapter can be checked at submit without loading the engine.
What PEFT writes and what Barge takes:

    peft_type        "LORA" only (no DoRA, LoHa, IA3, ...)
    r, lora_alpha    scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
    target_modules   any of q/k/v/o_proj, gate/up/down_proj (a list, or PEFT's regex string:
                     the tensors present decide, adapter.py)
    bias             "none" (a LoRA bias would change the base's bias term)
    rank_pattern, alpha_pattern, modules_to_save, use_dora    refused: per-module ranks and
                     scalings, retrained embeddings or heads are not served

A refusal is an AdapterError (a ValueError) naming the field and the adapter.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"


class AdapterError(ValueError):
    """An adapter that cannot be served on this base model: the message names the adapter and why."""


@dataclass(frozen=True)
class AdapterConfig:
    rank: int                 # r: rows of every lora_A, columns of every lora_B
    lora_alpha: float
    use_rslora: bool          # scaling by alpha / sqrt(r) (rank-stabilized LoRA)

    @property
    def scaling(self) -> float:
        return self.lora_alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def parse_adapter_config(text: str | bytes, source: str, max_rank: int) -> AdapterConfig:
    """adapter_config.json's text -> AdapterConfig; AdapterError naming the field it refuses."""
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise AdapterError(f"adapter {source}: {CONFIG_NAME} is not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"adapter {source}: {CONFIG_NAME} is not a JSON object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {source}: peft_type {raw.get('peft_type')!r} is not supported (only 'LORA')")
    rank = raw.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"adapter {source}: r must be an int >= 1, got {rank!r}")
    if rank > max_rank:
        raise AdapterError(f"adapter {source}: r={rank} exceeds this engine's max_lora_rank={max_rank}")
    alpha = raw.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AdapterError(f"adapter {source}: lora_alpha must be a number, got {alpha!r}")
    _refuse_unsupported(raw, source)
    return AdapterConfig(rank, float(alpha), bool(raw.get("use_rslora", False)))


def _refuse_unsupported(raw: dict, source: str) -> None:
    if raw.get("use_dora"):
        raise AdapterError(f"adapter {source}: use_dora is not supported (DoRA rescales the base weights)")
    if raw.get("bias", "none") != "none":
        raise AdapterError(f"adapter {source}: bias={raw['bias']!r} is not supported (only 'none')")
    for field in ("rank_pattern", "alpha_pattern", "modules_to_save"):
        if raw.get(field):
            raise AdapterError(f"adapter {source}: {field} is not supported, got {raw[field]!r}")
    targets = raw.get("target_modules")
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(PROJECTIONS))
        if unknown:
            raise AdapterError(f"adapter {source}: target_modules {unknown} are not supported "
                               f"(supported: {', '.join(PROJECTIONS)})")
