"""DecoderConfig: what the generate path needs to know about a Llama-family model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# model_type -> (qkv_bias, qk_norm). Everything else about these families is Llama.
SUPPORTED_MODEL_TYPES = {"llama": (False, False), "mistral": (False, False),
                         "qwen2": (True, False), "qwen3": (False, True)}
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class DecoderConfig:
    model_type: str                 # one of SUPPORTED_MODEL_TYPES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int               # < num_heads for grouped-query attention
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool                  # Qwen2
    qk_norm: bool                   # Qwen3: RMSNorm over each head of q and k before rotary
    rope_scaling: dict = field(default_factory=dict)   # rope_type + its parameters; {} = default
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    sliding_window: int | None = None   # we never attend past it: max_model_len is capped there

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads {self.num_kv_heads}")
        rope_type = self.rope_type
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"unsupported rope_scaling type {rope_type!r}; supported: {ROPE_TYPES}")

    @property
    def rope_type(self) -> str:
        return self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))

    @property
    def max_model_len(self) -> int:
        """The longest sequence (prompt + output) the model attends over correctly."""
        return min(self.max_position_embeddings, self.sliding_window or self.max_position_embeddings)


def load_decoder_config(folder: str | Path) -> DecoderConfig:
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"config.json not found in model folder {folder}")
    hf = json.loads(path.read_text())
    generation = folder / "generation_config.json"
    eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
    return decoder_config_from_hf(hf, eos if eos is not None else hf.get("eos_token_id"))


def decoder_config_from_hf(hf: dict, eos_token_id: int | list[int] | None) -> DecoderConfig:
    model_type = hf.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        architectures = ", ".join(hf.get("architectures") or []) or "unknown"
        raise ValueError(f"unsupported architecture for mode 'generate': model_type {model_type!r} ({architectures}); "
                         f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}")
    qkv_bias, qk_norm = SUPPORTED_MODEL_TYPES[model_type]
    num_heads = hf["num_attention_heads"]
    rope = _rope_parameters(hf)
    return DecoderConfig(
        model_type=model_type, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6), rope_theta=float(rope.pop("rope_theta", 10000.0)),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias or bool(hf.get("attention_bias", False)), qk_norm=qk_norm,
        rope_scaling=rope, eos_token_ids=_as_tuple(eos_token_id), bos_token_id=hf.get("bos_token_id"),
        sliding_window=_sliding_window(hf),
    )


def _rope_parameters(hf: dict) -> dict:
    """transformers 5 writes rope_parameters (theta inside); older configs rope_theta + rope_scaling."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    if rope.get("rope_type", rope.get("type")) == "default":
        rope = {"rope_theta": rope["rope_theta"]}
    return rope


def _sliding_window(hf: dict) -> int | None:
    if hf.get("model_type") in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
        return None
    return hf.get("sliding_window") or None


def _as_tuple(ids: int | list[int] | None) -> tuple[int, ...]:
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, (list, tuple)) else (ids,)
