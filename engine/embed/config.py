"""Embed-mode configuration: config.json (the architecture, per family in
engine/models/families.py) plus the sentence-transformers files beside it (pooling,
max_seq_length, lower-casing, named prompts)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.models.families import MODEL_TYPES as SUPPORTED_MODEL_TYPES, family_of

POOLING_MODES = ("mean", "cls", "max", "lasttoken", "mean_sqrt_len_tokens")
# sentence-transformers modules we reproduce; anything else (Dense, ...) would change
# the vectors, so we refuse it rather than return something subtly different.
KNOWN_ST_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class EncoderConfig:
    """What the embed path needs to know about a model folder."""

    model_name: str             # folder name, for logs and manifests
    model_type: str             # a key of SUPPORTED_MODEL_TYPES: "bert", "modernbert", "qwen3", ...
    family: str                 # "bert" | "modernbert" | "decoder" (engine/models/families.py)
    architecture: Any           # the family's config: BertConfig, ModernBertConfig or DecoderConfig
    hidden_size: int            # the embedding's size before Matryoshka truncation
    max_positions: int          # longest text the architecture attends over correctly
    pooling: str                # one of POOLING_MODES
    max_seq_length: int         # tokens per text after truncation, special tokens (and prompt) included
    do_lower_case: bool         # sentence-transformers lowercases before tokenizing
    prompts: dict[str, str] = field(default_factory=dict)   # name -> text put before each input
    default_prompt_name: str | None = None                  # applied when a call names no prompt
    include_prompt: bool = True  # False: the Pooling module leaves the prompt's tokens out

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"unsupported pooling mode {self.pooling!r}; expected one of {POOLING_MODES}")
        if not 0 < self.max_seq_length <= self.max_positions:
            raise ValueError(f"max_seq_length {self.max_seq_length} is outside 1..{self.max_positions} "
                             "(what the model's positions cover)")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name {self.default_prompt_name!r} is not one of the prompts "
                             f"{sorted(self.prompts)} in config_sentence_transformers.json")

    def prompt_for(self, prompt: str | None, prompt_name: str | None) -> str:
        """The text put before every input, as sentence-transformers' encode(prompt=, prompt_name=)
        chooses it: an explicit prompt, else the named one, else the folder's default, else none."""
        if prompt is not None and prompt_name is not None:
            raise ValueError("give prompt or prompt_name, not both")
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                known = ", ".join(sorted(self.prompts)) or "none"
                raise ValueError(f"prompt_name {prompt_name!r} is not one of the model's prompts (known: {known})")
            prompt = self.prompts[prompt_name]
        elif prompt is None and self.default_prompt_name is not None:
            prompt = self.prompts[self.default_prompt_name]
        if prompt and not self.include_prompt:
            raise ValueError("this model's Pooling module leaves the prompt's tokens out (include_prompt false), "
                             "which Barge does not reproduce; embed without a prompt")
        return prompt or ""


def load_encoder_config(folder: str | Path) -> EncoderConfig:
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder not found: {folder}")
    hf = _read_json(folder / "config.json", required=True)
    family = family_of(hf)
    _check_no_remote_code(folder, hf)
    _check_st_modules(folder)
    architecture = family.config_from_hf(hf)
    max_positions = family.max_positions(architecture)
    st_config = _read_json(folder / "sentence_bert_config.json")
    pooling = _pooling_config(folder)
    st_prompts = _read_json(folder / "config_sentence_transformers.json")
    return EncoderConfig(
        model_name=folder.resolve().name,
        model_type=hf["model_type"],
        family=family.name,
        architecture=architecture,
        hidden_size=hf["hidden_size"],
        max_positions=max_positions,
        pooling=_pooling_mode(folder, pooling) or family.default_pooling,
        max_seq_length=st_config.get("max_seq_length") or _default_max_seq_length(folder, max_positions),
        do_lower_case=bool(st_config.get("do_lower_case", False)),
        prompts=dict(st_prompts.get("prompts") or {}),
        default_prompt_name=st_prompts.get("default_prompt_name") or None,
        include_prompt=bool(pooling.get("include_prompt", True)),
    )


def is_embedding_folder(folder: str | Path) -> bool:
    """A sentence-transformers folder (modules.json), or an encoder-only architecture.
    Qwen3-Embedding's config.json names Qwen3ForCausalLM: its modules.json says it embeds."""
    folder = Path(folder)
    if (folder / "modules.json").is_file():
        return True
    family = SUPPORTED_MODEL_TYPES.get(_read_json(folder / "config.json").get("model_type", ""))
    return family is not None and family.name != "decoder"


def _read_json(path: Path, required: bool = False) -> dict:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path.name} not found in model folder {path.parent}")
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _check_no_remote_code(folder: Path, hf: dict) -> None:
    """A config that maps AutoModel to its own code (gte-Qwen2's bidirectional Qwen2, Jina's
    ALiBi BERT) keeps a stock model_type and often stock weight names: run as the stock
    architecture it would give other vectors without any error, so it is refused."""
    remote = (hf.get("auto_map") or {}).get("AutoModel")
    if remote:
        raise ValueError(f"{folder / 'config.json'} maps AutoModel to remote code ({remote}); Barge runs only the "
                         f"stock {hf.get('model_type')!r} architecture, which would give different vectors")


def _check_st_modules(folder: Path) -> None:
    modules = _read_json(folder / "modules.json")
    for module in modules or []:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        if kind not in KNOWN_ST_MODULES:
            raise ValueError(f"unsupported sentence-transformers module {module.get('type')!r} in {folder / 'modules.json'}")


def _pooling_config(folder: Path) -> dict:
    """The Pooling module's config.json; {} when the folder has none."""
    modules = _read_json(folder / "modules.json") or []
    pooling_dirs = [m.get("path", "") for m in modules if m.get("type", "").endswith("Pooling")]
    return _read_json(folder / (pooling_dirs[0] if pooling_dirs else "1_Pooling") / "config.json")


def _pooling_mode(folder: Path, pooling: dict) -> str | None:
    """The pooling the Pooling module's config names; None when there is no such config."""
    if not pooling:
        return None
    if "pooling_mode" in pooling:     # newer sentence-transformers write the mode by name
        return pooling["pooling_mode"]
    chosen = [mode for mode in POOLING_MODES if pooling.get(_pooling_key(mode))]
    if len(chosen) != 1:
        raise ValueError(f"expected exactly one pooling mode in {folder}/1_Pooling/config.json, got {chosen or 'none'}")
    return chosen[0]


def _pooling_key(mode: str) -> str:
    return {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
            "max": "pooling_mode_max_tokens", "lasttoken": "pooling_mode_lasttoken"}.get(mode, f"pooling_mode_{mode}")


def _default_max_seq_length(folder: Path, max_positions: int) -> int:
    """Without sentence_bert_config.json: what the model's positions and the tokenizer allow."""
    limit = max_positions
    tokenizer_limit = _read_json(folder / "tokenizer_config.json").get("model_max_length")
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < limit:
        limit = tokenizer_limit
    return limit
