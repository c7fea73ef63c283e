"""Encoder configuration: config.json plus the sentence-transformers files beside it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# model_type -> offset added to position ids. RoBERTa-style models number positions
# from pad_token_id + 1, so position 0 of the text is embedding row pad_token_id + 1.
SUPPORTED_MODEL_TYPES = {"bert": False, "roberta": True, "xlm-roberta": True}
POOLING_MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens")
# sentence-transformers modules we reproduce; anything else (Dense, ...) would change
# the vectors, so we refuse it rather than return something subtly different.
KNOWN_ST_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class EncoderConfig:
    """What the embed path needs to know about a BERT-style model folder."""

    model_name: str             # folder name, for logs and manifests
    model_type: str             # "bert" | "roberta" | "xlm-roberta"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str             # "gelu" | "gelu_new" | "gelu_pytorch_tanh" | "relu"
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    pad_token_id: int
    position_offset: int        # 0 for BERT, pad_token_id + 1 for RoBERTa
    pooling: str                # one of POOLING_MODES
    max_seq_length: int         # tokens per text after truncation, special tokens included
    do_lower_case: bool         # sentence-transformers lowercases before tokenizing

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_heads}")
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"unsupported pooling mode {self.pooling!r}; expected one of {POOLING_MODES}")
        usable = self.max_position_embeddings - self.position_offset
        if not 0 < self.max_seq_length <= usable:
            raise ValueError(f"max_seq_length {self.max_seq_length} is outside 1..{usable} (position embeddings)")


def load_encoder_config(folder: str | Path) -> EncoderConfig:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    hf = _read_json(folder / "config.json", required=True)
    model_type = hf.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        architectures = ", ".join(hf.get("architectures") or []) or "unknown"
        raise ValueError(
            f"unsupported architecture for mode 'embed': model_type {model_type!r} ({architectures}); "
            f"supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    _check_st_modules(folder)
    pad_token_id = hf.get("pad_token_id", 0) or 0
    position_offset = pad_token_id + 1 if SUPPORTED_MODEL_TYPES[model_type] else 0
    st_config = _read_json(folder / "sentence_bert_config.json")
    return EncoderConfig(
        model_name=folder.resolve().name,
        model_type=model_type,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        hidden_act=hf.get("hidden_act", "gelu"),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        max_position_embeddings=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2),
        pad_token_id=pad_token_id,
        position_offset=position_offset,
        pooling=_pooling_mode(folder),
        max_seq_length=st_config.get("max_seq_length") or _default_max_seq_length(folder, hf, position_offset),
        do_lower_case=bool(st_config.get("do_lower_case", False)),
    )


def _read_json(path: Path, required: bool = False) -> dict:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path.name} not found in model folder {path.parent}")
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _check_st_modules(folder: Path) -> None:
    modules = _read_json(folder / "modules.json")
    for module in modules or []:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in KNOWN_ST_MODULES:
            raise ValueError(f"unsupported sentence-transformers module {module.get('type')!r} in {folder / 'modules.json'}")


def _pooling_mode(folder: Path) -> str:
    """The pooling named by the Pooling module's config; mean when there is none."""
    modules = _read_json(folder / "modules.json") or []
    pooling_dirs = [m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")]
    pooling = _read_json(folder / (pooling_dirs[0] if pooling_dirs else "1_Pooling") / "config.json")
    if not pooling:
        return "mean"
    if "pooling_mode" in pooling:     # newer sentence-transformers write the mode by name
        return pooling["pooling_mode"]
    chosen = [mode for mode in POOLING_MODES if pooling.get(_pooling_key(mode))]
    if len(chosen) != 1:
        raise ValueError(f"expected exactly one pooling mode in {folder}/1_Pooling/config.json, got {chosen or 'none'}")
    return chosen[0]


def _pooling_key(mode: str) -> str:
    return {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
            "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}.get(mode, f"pooling_mode_{mode}")


def _default_max_seq_length(folder: Path, hf: dict, position_offset: int) -> int:
    """Without sentence_bert_config.json: what the position table and tokenizer allow."""
    limit = hf["max_position_embeddings"] - position_offset
    tokenizer_limit = _read_json(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < limit:
        limit = tokenizer_limit
    return limit
