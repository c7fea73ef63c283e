"""What a model folder says about scoring it, read from config.json alone. Torch-free:
the worker and job validation decide which scorer a model needs without loading it.

    architectures[0]                       score_method    the scorer (engine/score/)
    *ForSequenceClassification             cross-encoder   Classifier (classify; score pairs when one label)
    *ForCausalLM, or a .gguf file          yes-no          YesNoReranker (P(yes) through the generate engine)
    modules.json, or a bare encoder        bi-encoder      BiEncoder (cosine of two embeddings)

HeadConfig is the classification head of a *ForSequenceClassification folder: its labels,
its problem type (which picks the activation), its pooling, and the activation a
sentence-transformers CrossEncoder saved beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
ENCODER_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "modernbert")
DECODER_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# sentence-transformers' saved activation_fn (a dotted class path) -> ours; others are refused.
CROSS_ENCODER_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "none"}


@dataclass(frozen=True)
class HeadConfig:
    """The head of a *ForSequenceClassification model, from its config.json."""

    architecture: str               # "BertForSequenceClassification", "LlamaForSequenceClassification", ...
    model_type: str                 # one of ENCODER_MODEL_TYPES or DECODER_MODEL_TYPES
    labels: tuple[str, ...]         # [num_labels] label name by class id (id2label)
    problem_type: str | None        # one of PROBLEM_TYPES, or None (then num_labels decides)
    pooling: str                    # "cls" | "mean" (ModernBERT's classifier_pooling) | "last" (decoders:
                                    # the last token that is not pad_token_id, as transformers pools)
    pad_token_id: int | None        # decoders: None pools each text's very last token
    classifier_activation: str      # ModernBERT's head: dense -> this -> norm
    classifier_bias: bool           # ModernBERT's head: whether its dense layer has a bias
    saved_activation: str | None    # what a sentence-transformers CrossEncoder saved: "sigmoid" | "none" | None

    def __post_init__(self) -> None:
        if not self.labels:
            raise ValueError(f"{self.architecture} has no labels (num_labels 0)")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"unsupported problem_type {self.problem_type!r}; expected one of {PROBLEM_TYPES}")

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def is_decoder(self) -> bool:
        return self.model_type in DECODER_MODEL_TYPES

    @property
    def classify_activation(self) -> str:
        """transformers' reading of the head: sigmoid for multi-label, the raw value for one
        label (regression, reward models), else softmax."""
        if self.problem_type == "multi_label_classification":
            return "sigmoid"
        if self.num_labels == 1 or self.problem_type == "regression":
            return "none"
        return "softmax"

    @property
    def cross_encoder_activation(self) -> str:
        """CrossEncoder.predict's default: the saved activation_fn, else sigmoid for one label."""
        if self.saved_activation is not None:
            return self.saved_activation
        return "sigmoid" if self.num_labels == 1 else "none"


def head_config_from_hf(hf: dict) -> HeadConfig:
    """ValueError naming what is not a sequence classifier Barge runs."""
    architecture = (hf.get("architectures") or ["unknown"])[0]
    model_type = hf.get("model_type", "")
    if not architecture.endswith("ForSequenceClassification"):
        raise ValueError(f"{architecture} is not a sequence classifier (*ForSequenceClassification)")
    if model_type not in ENCODER_MODEL_TYPES + DECODER_MODEL_TYPES:
        raise ValueError(f"unsupported classifier model_type {model_type!r} ({architecture}); supported: "
                         f"{', '.join(ENCODER_MODEL_TYPES + DECODER_MODEL_TYPES)}")
    pooling = "last" if model_type in DECODER_MODEL_TYPES else "cls"
    if model_type == "modernbert":
        pooling = hf.get("classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise ValueError(f"unsupported ModernBERT classifier_pooling {pooling!r}; expected 'cls' or 'mean'")
    return HeadConfig(architecture=architecture, model_type=model_type, labels=_labels(hf),
                      problem_type=hf.get("problem_type"), pooling=pooling, pad_token_id=hf.get("pad_token_id"),
                      classifier_activation=hf.get("classifier_activation", "gelu"),
                      classifier_bias=bool(hf.get("classifier_bias", False)),
                      saved_activation=_saved_activation(hf))


def read_config(path: str | Path) -> dict:
    """config.json of a model folder; {} for a file (GGUF) or a folder without one."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return {}
    with open(config, encoding="utf-8") as f:
        return json.load(f)


def score_method(path: str | Path) -> str:
    """"cross-encoder" | "yes-no" | "bi-encoder": how a model at `path` scores pairs
    (the table at the top). ValueError for a model that can score none."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return "yes-no"
    hf = read_config(path)
    architecture = (hf.get("architectures") or [""])[0]
    if architecture.endswith("ForSequenceClassification"):
        return "cross-encoder"
    if (path / "modules.json").is_file():       # Qwen3-Embedding names Qwen3ForCausalLM: it embeds
        return "bi-encoder"
    if architecture.endswith("ForCausalLM") and hf.get("model_type") in DECODER_MODEL_TYPES:
        return "yes-no"
    if hf.get("model_type") in ENCODER_MODEL_TYPES:
        return "bi-encoder"
    raise ValueError(f"{path} cannot score pairs: {architecture or 'no architecture'} is neither a sequence "
                     "classifier, a causal LM of a supported family, nor an embedding model")


def _labels(hf: dict) -> tuple[str, ...]:
    id2label = {int(index): str(label) for index, label in (hf.get("id2label") or {}).items()}
    num_labels = len(id2label) if id2label else int(hf.get("num_labels", 2))
    return tuple(id2label.get(index, f"LABEL_{index}") for index in range(num_labels))


def _saved_activation(hf: dict) -> str | None:
    """sentence-transformers writes config.json's sentence_transformers.activation_fn (v4+),
    or sbert_ce_default_activation_function (before v4)."""
    path = (hf.get("sentence_transformers") or {}).get("activation_fn") or hf.get("sbert_ce_default_activation_function")
    if path is None:
        return None
    name = str(path).rsplit(".", 1)[-1]
    if name not in CROSS_ENCODER_ACTIVATIONS or not str(path).startswith("torch."):
        raise ValueError(f"unsupported cross-encoder activation_fn {path!r} in config.json; supported: torch's "
                         f"{', '.join(CROSS_ENCODER_ACTIVATIONS)}")
    return CROSS_ENCODER_ACTIVATIONS[name]
